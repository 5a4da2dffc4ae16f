#!/usr/bin/env bash
# Every GPU figure of the head-map kernel work, on a bare H100/H200 machine (Python 3.12, torch, timm, triton
# preinstalled; no package index reachable), in calls of under 10 minutes each (one call for the figures the issue
# asks for). Run from the repository root:
#
#   OUT=/some/dir bash bench/gpu_run.sh                 # the plan below; no part starts after GPU_RUN_DEADLINE_S (540)
#   OUT=/some/dir bash bench/gpu_run.sh b16_448 tests   # only some parts (setup always runs first)
#   OUT=/some/dir bash bench/gpu_run.sh issue           # the figures issue #26 asks for (~360 s on an H100)
#   GPU_RUN_DEADLINE_S=1800 OUT=/some/dir bash bench/gpu_run.sh all   # a GPU of one's own: every part, nothing cut
#
# Sized for a GPU lent for minutes with a limit of 10 minutes per command: one call, `bash bench/gpu_run.sh` with a
# 600 s limit ($OUT set). The parts run in the order the figures need them, each with its own time limit, each going
# on when an earlier one failed, none started with under 30 s left before the deadline; every part writes its JSON
# after each case, so a cut keeps what was measured before it.
#
# A call resumes its $OUT: nothing there is removed, each part's rows are appended to its JSON, and a part of the
# plan that an earlier call into the same $OUT ran to its end ("done: PART" in parts.txt: none of its commands
# skipped by the deadline or cut by its limit) is skipped (GPU_RUN_REDO=1 runs it again). So the whole plan, longer
# than one call, is the same command run again until the summary says no part was skipped, each call under 600 s:
#
#   OUT=$R bash bench/gpu_run.sh issue   # call 1: setup, tests, b16_448, l16_448, dataset, b16_224, l16_224
#   OUT=$R bash bench/gpu_run.sh         # call 2, 3: the rest of the plan, each resuming from the JSON written
#
# A case measured twice (a part cut and run again) counts its later process's rows only (bench/attention.py's
# cases()); a new run wants a new, empty $OUT. The parts:
#
#   setup          versions, GPU, vitviz installed (pip install --no-deps -e . offline; else PYTHONPATH), a kernel
#                  smoke check, timm from .whl/ when the machine's is older than vitviz's stream probe needs
#                                                                                              (~40 s, cap 90)
#   b16_448        bench/attention.py, ViT-B/16 at 448 px (batch 8), bf16 then fp32, one process each: plain,
#                  explicit, store, timm, rollout and distance on the PyTorch stream path (*_torch) and with the
#                  kernels (*_kernel), rollout with the forward's log-sum-exp (rollout_fwdlse): the goal cases
#                                                                                  (~25 s a process, cap 90 each)
#   graphed        bench/attention.py, ViT-B/16 at 448 px (batch 8), bf16 then fp32: rollout and distance recorded
#                  as CUDA graphs (vitviz.graphed: the call's Python once, then one replay per call) beside the
#                  kernels' eager calls, and the plain forward recorded the same way (plain_graphed, the floor of
#                  a recorded call), store and store_distance for the memory goal; and the four kernel calls again
#                  with sm_90's previous tiles (*_prev: both tile tables end to end in one process);
#                  attention_graphed.json. The rehearsal on the CPU, where no graph can be recorded, runs the part's
#                  eager methods only                                              (~40 s a process, cap 90 each)
#   micro_b16      bench/headmap_kernel.py on ViT-B/16's 448 px layer, bf16 and fp32 (3xTF32): the kernels alone
#                  against SDPA per layer, vitviz's block shapes and the candidates (headmap_kernel.CANDIDATES:
#                  4-warp 64-row and 8-warp 128-row tiles, which bench/headmap_sass.py finds free of the shared
#                  memory exchanges 8-warp 64-row tiles make per reduction); micro.json    (~20 s, cap 120)
#   profile        where a call's time goes, ViT-B/16 448 px batch 8 (bench/profile_attention.py): first the
#                  timeline of plain, rollout_kernel, rollout_fwdlse and distance_kernel (timm's also recorded:
#                  plain_graphed, rollout_graphed, distance_graphed; not in the rehearsal) (host time to return,
#                  device kernel and busy time, CUDA runtime calls, idle gaps, each synchronisation with its vitviz
#                  frames: timeline.json) for timm's model in bf16 and fp32 and Hugging Face's in bf16; then in
#                  bf16 cProfile's Python functions over 10 calls, and torch.profiler's CUDA operators of
#                  rollout_kernel; into run.log                                      (~25 s, cap 60 each)
#   tests          pytest -m gpu over the files that hold gpu tests (the kernels against the PyTorch path on
#                  ViT-B/16 448 px shapes, the forward LSE, the peak-memory bound, CUDA checks)   (~90 s, cap 150)
#   batch          ViT-B/16 at 448 px at larger batches (bf16: 32 and 64, fp32: 32), one process each: plain,
#                  rollout_kernel, rollout_fwdlse, distance_kernel: whether the time beyond the forward is a fixed
#                  cost per call (it then shrinks against a forward that grows with the batch); attention_batch.json
#                                                                                  (~20 s a process, cap 60 each)
#   l16_448        the same for ViT-L/16                                          (~35 s a process, cap 90 each)
#   faith          bench/faithfulness_speed.py, ViT-B/16 224 px, bf16 autocast, 100 images in batches of 50,
#                  precomputed maps: vitviz.faithfulness's loop against as many plain passes back to back, and
#                  against the same loop reading each pass's output before the next (the device's idle time
#                  that costs); faithfulness.json                                             (~40 s, cap 90)
#   dataset        bench/dataset.py, ViT-B/16 224 px, bf16 autocast, 16,384 synthetic images (a pool of 1,024 read
#                  in turn), batch 256, 4 workers: plain forward, distance (kernels), plain again
#                                                                                  (~30 s a process, cap 75 each)
#   b16_224        ViT-B/16 at 224 px (batch 32), bf16 then fp32                  (~20 s a process, cap 90 each)
#   l16_224        ViT-L/16 at 224 px                                             (~30 s a process, cap 90 each)
#   hf             a Hugging Face ViTModel of ViT-B/16's size (SDPA; its stream probe, vitviz/core/families/
#                  hf_probes.py) at 448 px, bf16 then fp32, without timm's anchor  (~25 s a process, cap 90 each)
#   tv             torchvision's vit_b_16 (nn.MultiheadAttention; stream.probe_mha_stream) at 448 px, bf16 then
#                  fp32, without timm's anchor nor the forward LSE                 (~25 s a process, cap 90 each)
#   dataset_torch  the dataset path's distance on the PyTorch stream path (kernels off)          (~30 s, cap 75)
#   micro          the same for the other shapes (ViT-L/16 at 448 px, both at 224 px), bf16, fp32 (3xTF32) and
#                  fp32-ieee, appended to micro.json                                (what time is left, cap 300)
#
# Aliases: issue = tests b16_448 l16_448 dataset b16_224 l16_224 (the figures the issue asks for, in one call),
# attn_b16 = b16_448 b16_224, attn_l16 = l16_448 l16_224, attn_hf = hf tv, all = the whole plan.
# bench/attention.py exits 3 when every case ran and a goal was missed, 1 when a case or one of its methods failed
# (a failed method is named and left out; the case's other methods keep their rows).
#
# The times above are from the two H100 runs (bench/results/h100_gpu_run_1/summary.txt: a bench/attention.py process
# 22-39 s, a dataset one 23-28 s, the tests 35 s, micro 61 s for 72 rows); the H200's run 3, every part but micro
# in 512 s (bench/results/h200_gpu_run_3/summary.txt: a bench/attention.py process 14-32 s, profile 75 s in all,
# the tests 36 s, batch 52 s, faith 14 s, a dataset process 18-24 s), agrees. The plan puts the parts that answer
# open questions first: the recorded calls (both tile tables end to end, the input check's memory), the GPU tests
# (the code changed since run 6: they must pass), the goal cases, where a recorded call's time goes, ViT-L/16, the
# batch scaling and the dataset path in sm_90's current tiles, Hugging Face and torchvision (not measured since run
# 3); then what runs 5 and 6 already have (the tile sweep of the goal's layer, 224 px, the faithfulness loop), the
# dataset path without kernels and the other shapes' sweep: up to and with tv should end by about 520 s, and the
# summary says SKIPPED for a part that found too little (GPU_RUN_DEADLINE_S=1800 ... all runs everything).
#
# GPU_RUN_REHEARSAL=1 runs the same parts on the CPU (tests/test_gpu_run.py, in `make test`): tiny models and
# shapes, the kernels under Triton's interpreter, nothing installed, no deadline unless one is given; so the script
# and every command line it builds are known to work before a GPU is at hand. Its figures mean nothing.
#
# A machine that hands back at most a few files: let the script write elsewhere and pack it, e.g.
#   mkdir -p /tmp/g; OUT=/tmp/g timeout 568 bash bench/gpu_run.sh; tar czf "$RESULTS/gpu_run.tgz" -C /tmp/g .
#
# Output under $OUT, 13 files: env.json (with the GPU and versions of every call into $OUT), attention_b16.json, attention_graphed.json, attention_l16.json,
# attention_hf.json (the Hugging Face and the torchvision rows), attention_batch.json, dataset.json, micro.json,
# timeline.json, faithfulness.json, run.log (everything printed, the gpu tests' output with it; appended by each
# call), parts.txt (each call's parts, each command's exit status as it ends, the parts done) and summary.txt
# (parts.txt, the goal lines, the tests' counts). Each row of the JSON files names its GPU, the versions and the
# command that measured it.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu_run}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/run.log"
PARTS_TXT="$OUT/parts.txt"  # every call's parts and their exit status, written as each ends; "done: PART" for a
touch "$PARTS_TXT"          # part of the plan that ran to its end, which a later call into this $OUT skips
echo "=== gpu_run call at $(date -u +%FT%TZ): $*" >>"$LOG"  # appended: a later call resumes this $OUT
START=$SECONDS
PART_CUT=0  # set when one of the current part's commands was skipped or cut by its time limit

# result LINE: one command's or part's outcome, into parts.txt at once (a call killed from outside keeps it)
result() { echo "$1" >>"$PARTS_TXT"; }
# what each part runs on: the GPU, or (GPU_RUN_REHEARSAL=1) the CPU with tiny stand-ins
if [ "${GPU_RUN_REHEARSAL:-0}" = 1 ]; then
    export TRITON_INTERPRET=1
    DEADLINE_S=${GPU_RUN_DEADLINE_S:-3600}  # the interpreter is slow and a CI machine may be shared: no cut,
    CAP_SCALE=4                             # and each part's time limit four times the GPU's
    DEV=cpu REPEATS=1 SMALL=32 LARGE=48 BATCH_SMALL=2 BATCH_LARGE=2 KERNEL_AUTO=on AMP=off ATTN_EXTRA=(--no-memory)
    B16=vit_tiny_patch16_224 L16=vit_small_patch16_224 DATA_MODEL=cifar10-vit DATA_N=8 DATA_BATCH=4 WORKERS=0
    SMOKE="2 3 37 16" PROFILE_DTYPE=fp32 PROFILE_CALLS=2 BATCHES=("bf16 3" "bf16 4" "fp32 3")
    FAITH_ARGS=(--n 4 --batch 2 --steps 0.5 --autocast off --repeats 1)
    GRAPHED_METHODS="plain store store_distance rollout_kernel rollout_fwdlse distance_kernel rollout_kernel_prev
distance_kernel_prev"  # no CUDA graph here
    GRAPHED_METHODS=${GRAPHED_METHODS//$'\n'/ }
    MICRO_B16_ARGS=(--device cpu --shapes tiny --dtypes fp32 --blocks default 16,16,1,1)
    MICRO_ARGS=(--device cpu --shapes tiny --dtypes fp32-ieee --blocks default 16,16,1,1)
else
    DEADLINE_S=${GPU_RUN_DEADLINE_S:-540}  # no part starts after this: one device call of 600 s at most
    CAP_SCALE=1
    DEV=cuda REPEATS=5 SMALL=224 LARGE=448 BATCH_SMALL=32 BATCH_LARGE=8 KERNEL_AUTO=auto AMP=bf16
    ATTN_EXTRA=()
    B16=vit_base_patch16_224 L16=vit_large_patch16_224 DATA_MODEL=vit_base_patch16_224 DATA_N=16384 DATA_BATCH=256
    WORKERS=4 SMOKE="2 12 197 64" PROFILE_DTYPE=bf16 PROFILE_CALLS=10 BATCHES=("bf16 32" "bf16 64" "fp32 32")
    MICRO_B16_ARGS=(--shapes vit_b16_448 --dtypes bf16 fp32)
    MICRO_ARGS=(--shapes vit_l16_448 vit_b16_224 vit_l16_224)
    FAITH_ARGS=(--n 100 --batch 50 --steps 0.1 --autocast bf16 --repeats 3)
    GRAPHED_METHODS="plain plain_graphed store store_distance rollout_kernel rollout_fwdlse rollout_graphed
distance_kernel distance_graphed rollout_kernel_prev distance_kernel_prev rollout_graphed_prev distance_graphed_prev"
    GRAPHED_METHODS=${GRAPHED_METHODS//$'\n'/ }
fi

note() { echo "[gpu_run +$((SECONDS - START))s] $*" | tee -a "$LOG"; }

# run_part NAME LIMIT_S COMMAND...: runs with a time limit (LIMIT_S x CAP_SCALE, cut to what is left before
# DEADLINE_S), output appended to run.log; records the exit status; skipped when under 30 s are left
run_part() {
    local name=$1 limit=$(($2 * CAP_SCALE))
    shift 2
    local left=$((DEADLINE_S - (SECONDS - START)))
    if [ "$left" -lt 30 ]; then
        PART_CUT=1
        result "$name: SKIPPED (${left}s left of GPU_RUN_DEADLINE_S=$DEADLINE_S)"
        note "--- $name: skipped, ${left}s left"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    note "--- $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] || [ "$rc" = 137 ] && PART_CUT=1  # cut by its limit: the part runs again in a later call
    result "$name: exit $rc after $((SECONDS - START))s"
    note "--- $name: exit $rc"
}

part_setup() {
    if [ "${GPU_RUN_REHEARSAL:-0}" = 1 ]; then
        note "rehearsal on the CPU: nothing installed, tiny models, TRITON_INTERPRET=1"
    elif [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # wheels brought along (a newer timm, say)
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            && export PYTHONPATH="$PYTHONPATH:/tmp/site" && note "installed carried wheels: $(ls .whl)"
    fi
    [ "${GPU_RUN_REHEARSAL:-0}" = 1 ] || { $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . \
        >>"$LOG" 2>&1 && note "vitviz installed (editable, no deps)" \
        || note "pip install -e . did not work offline: using PYTHONPATH=$PWD"; }
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
    run_part setup 90 $PY - "$OUT/env.json" "$DEV" $SMOKE <<'EOF'
import json, sys, importlib.metadata as md
import torch
info = {"python": sys.version.split()[0], "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
for name in ("torch", "timm", "triton", "transformers", "numpy"):
    try:
        info[name] = md.version(name)
    except md.PackageNotFoundError:
        info[name] = None
import os, traceback
try:  # a later call into the same $OUT (a resumed run): the machine and versions of every call, in order
    with open(sys.argv[1]) as f:
        earlier = json.load(f)
    calls = earlier.get("calls") or [{k: earlier.get(k) for k in ("gpu", "torch", "timm", "triton")}]
except (OSError, ValueError):
    calls = []
info["calls"] = calls + [{k: info[k] for k in ("gpu", "torch", "timm", "triton")}]

def write():  # atomically, and first before any step that may fail: the versions are what a failed run needs most
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump(info, f, indent=1)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])

write()
try:
    import vitviz, timm
    from packaging.version import Version
    info["vitviz_file"] = vitviz.__file__
    info["timm_stream_probe"] = Version(timm.__version__) >= Version("1.0.26")
    if not info["timm_stream_probe"]:
        print(f"WARNING: timm {timm.__version__} < 1.0.26: the stream probe (and so the kernels) are off for timm "
              "models; put a timm>=1.0.26 wheel in .whl/ (this script's setup installs it)")
    from vitviz.core import kernels
    info["use_kernel"] = kernels.use_kernel(sys.argv[2])
    from vitviz.core.kernels import headmaps
    b, h, n, d = (int(v) for v in sys.argv[3:7])  # one layer of ViT-B/16 at 224 px (rehearsal: a tiny one)
    q, k = (torch.randn(b, h, n, d, device=sys.argv[2], dtype=torch.bfloat16) for _ in range(2))
    ref = (q.double() @ k.double().transpose(-1, -2) * d ** -0.5).softmax(-1).mean(1)
    info["smoke_max_abs"] = float((headmaps.fuse_heads_kernel(q, k, d ** -0.5).double() - ref).abs().max())
except Exception as e:  # the versions stay written, with what failed
    traceback.print_exc()
    info["smoke_error"] = f"{type(e).__name__}: {str(e)[:500]}"
print(json.dumps(info, indent=1))
write()
sys.exit(0 if info.get("smoke_max_abs", float("inf")) < 1e-5 else 1)
EOF
}

part_tests() {  # only the files that hold gpu tests: collecting the whole suite would import all of it
    local files
    files=$(grep -l "pytest.mark.gpu" tests/test_*.py | tr '\n' ' ')
    run_part tests 150 $PY -m pytest -q -p no:cacheprovider -m gpu $files -o addopts="-ra" --timeout=120
}

part_profile() {  # each timeline run appended to timeline.json (and printed to run.log), the tables to run.log
    local spec model dt part
    # timm's ViT-B/16 in bf16 and fp32, and Hugging Face's of the same size in bf16: in run 1 the same call took
    # 33.7 ms on the timm model and 15.7 ms on the Hugging Face one (plain forwards 5.3 and 4.3 ms)
    # timm's also recorded (where the time of a recorded call goes beyond its recorded forward's: the host's
    # state comparison and input check before the replay, or the device's work)
    local methods
    for spec in "$B16 bf16" "$B16 fp32" "hf:vit-base-patch16 bf16"; do
        read -r model dt <<<"$spec"
        part="profile_timeline_${model#*:}_$dt"
        methods="plain rollout_kernel rollout_fwdlse distance_kernel"
        [ "$DEV" = cuda ] && [ "$model" = "$B16" ] && methods="$methods plain_graphed rollout_graphed distance_graphed"
        # shellcheck disable=SC2086  # one word per method
        run_part "$part" 60 $PY bench/profile_attention.py --device "$DEV" --dtype "$dt" \
            --model "$model" --size "$LARGE" --batch "$BATCH_LARGE" --timeline --calls "$PROFILE_CALLS" \
            --method $methods --json "$OUT/timeline.json"
    done
    run_part profile_python 60 $PY bench/profile_attention.py --device "$DEV" --dtype "$PROFILE_DTYPE" \
        --model "$B16" --size "$LARGE" --batch "$BATCH_LARGE" --method plain rollout_kernel distance_kernel \
        --python --calls "$PROFILE_CALLS" --rows 40
    run_part profile_ops 60 $PY bench/profile_attention.py --device "$DEV" --dtype "$PROFILE_DTYPE" \
        --model "$B16" --size "$LARGE" --batch "$BATCH_LARGE" --method rollout_kernel --rows 25
}

part_faith() {
    run_part faithfulness 90 $PY bench/faithfulness_speed.py --device "$DEV" --model "$B16" --size "$SMALL" \
        "${FAITH_ARGS[@]}" --json "$OUT/faithfulness.json"
}

part_micro() {  # part_micro NAME LIMIT ARGS...: rows appended to micro.json
    local name=$1 limit=$2
    shift 2
    run_part "$name" "$limit" $PY bench/headmap_kernel.py "$@" --json "$OUT/micro.json"
}

METHODS="plain explicit store timm rollout_torch rollout_kernel rollout_fwdlse store_distance distance_torch
distance_kernel"
METHODS=${METHODS//$'\n'/ }
# Hugging Face: no timm anchor (AttentionExtract); torchvision: nor a forward log-sum-exp (its MultiheadAttention
# runs its attention inside one ATen op, see vitviz/core/kernels/forward_lse.py)
TV_METHODS="plain explicit store rollout_torch rollout_kernel store_distance distance_torch distance_kernel"
HF_METHODS="$TV_METHODS rollout_fwdlse"

part_attn() {  # part_attn TAG MODEL SIZE METHODS: one process per dtype, rows appended to attention_TAG.json
    local tag=$1 model=$2 size=$3 methods=$4 dt batch
    batch=$([ "$size" = "$SMALL" ] && echo "$BATCH_SMALL" || echo "$BATCH_LARGE")
    for dt in bf16 fp32; do
        run_part "attention_${tag}_${model#*:}_${dt}_$size" 90 $PY bench/attention.py --device "$DEV" \
            --model "$model" --dtype "$dt" --sizes "$size" --batch "$batch" --repeats "$REPEATS" "${ATTN_EXTRA[@]}" \
            --methods $methods --json "$OUT/attention_$tag.json"
    done
}

BATCH_METHODS="plain rollout_kernel rollout_fwdlse distance_kernel"

part_batch() {  # ViT-B/16 at 448 px at the larger batches of BATCHES ("DTYPE BATCH"), rows to attention_batch.json
    local spec dt batch
    for spec in "${BATCHES[@]}"; do
        read -r dt batch <<<"$spec"
        run_part "attention_batch_${dt}_$batch" 60 $PY bench/attention.py --device "$DEV" --model "$B16" --dtype "$dt" \
            --sizes "$LARGE" --batch "$batch" --repeats "$REPEATS" "${ATTN_EXTRA[@]}" --methods $BATCH_METHODS \
            --json "$OUT/attention_batch.json"
    done
}

part_dataset() {  # part_dataset "REDUCTION KERNEL"...: one process each, its row appended to dataset.json
    local json="$OUT/dataset.json" row="$OUT/.dataset_row.json" spec red kern
    for spec in "$@"; do
        read -r red kern <<<"$spec"
        rm -f "$row"
        run_part "dataset_${red}_kernel-$kern" 75 $PY bench/dataset.py --model "$DATA_MODEL" --synthetic "$DATA_N" \
            --device "$DEV" --batch "$DATA_BATCH" --workers "$WORKERS" --autocast "$AMP" --reduction "$red" \
            --kernel "$kern" --warmup "$([ "$DEV" = cuda ] && echo 4 || echo 1)" --json "$row"
        [ -f "$row" ] || continue
        $PY - "$row" "$json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, os, pathlib, sys
row, path = json.loads(pathlib.Path(sys.argv[1]).read_text()), pathlib.Path(sys.argv[2])
rows = (json.loads(path.read_text()) if path.exists() else []) + [row]
tmp = path.with_suffix(".tmp")
tmp.write_text(json.dumps(rows, indent=1) + "\n")
os.replace(tmp, path)
os.remove(sys.argv[1])
plain = [r["images_per_s"] for r in rows if r["reduction"] == "plain"]
ratio = row["images_per_s"] / max(plain) if plain else float("nan")
print(f"dataset {row['reduction']:9} kernel={row.get('kernel')} {row['images_per_s']:8.1f} img/s "
      f"({ratio:.0%} of the fastest plain run so far; goal >= 85%) peak {row['peak_mib']:.0f} MiB")
EOF
    done
}

PLAN=(graphed tests b16_448 profile l16_448 batch dataset hf tv micro_b16 b16_224 l16_224 faith dataset_torch micro)
# the figures issue #26 asks for, first: the gpu tests, both models at both sizes in bf16 and fp32, the dataset path
# (H100 run 1: 336 s for these parts after a 22 s setup)
ISSUE=(tests b16_448 l16_448 dataset b16_224 l16_224)
PARTS=(setup)  # versions and the smoke check come first, always
[ $# -eq 0 ] && set -- "${PLAN[@]}"
for part in "$@"; do
    case $part in
        issue) PARTS+=("${ISSUE[@]}") ;;
        attn_b16) PARTS+=(b16_448 b16_224) ;;
        attn_l16) PARTS+=(l16_448 l16_224) ;;
        attn_hf) PARTS+=(hf tv) ;;
        all) PARTS+=("${PLAN[@]}") ;;
        setup) ;;
        *) PARTS+=("$part") ;;
    esac
done
note "parts: ${PARTS[*]}; deadline ${DEADLINE_S} s; OUT=$OUT"
result "gpu_run parts: ${PARTS[*]} (deadline ${DEADLINE_S} s; started $(date -u +%FT%TZ))"
for part in "${PARTS[@]}"; do
    if [ "$part" != setup ] && [ "${GPU_RUN_REDO:-0}" != 1 ] && grep -qx "done: $part" "$PARTS_TXT"; then
        result "$part: DONE in an earlier call into this \$OUT (GPU_RUN_REDO=1 runs it again)"
        note "--- $part: done in an earlier call, skipped"
        continue
    fi
    PART_CUT=0
    case $part in
        setup) part_setup ;;
        b16_448) part_attn b16 "$B16" "$LARGE" "$METHODS" ;;
        graphed) part_attn graphed "$B16" "$LARGE" "$GRAPHED_METHODS" ;;
        l16_448) part_attn l16 "$L16" "$LARGE" "$METHODS" ;;
        b16_224) part_attn b16 "$B16" "$SMALL" "$METHODS" ;;
        l16_224) part_attn l16 "$L16" "$SMALL" "$METHODS" ;;
        hf) part_attn hf hf:vit-base-patch16 "$LARGE" "$HF_METHODS" ;;
        tv) part_attn hf tv:vit_b_16 "$LARGE" "$TV_METHODS" ;;
        dataset) part_dataset "plain $KERNEL_AUTO" "distance $KERNEL_AUTO" "plain $KERNEL_AUTO" ;;
        dataset_torch) part_dataset "distance off" ;;
        tests) part_tests ;;
        profile) part_profile ;;
        batch) part_batch ;;
        faith) part_faith ;;
        micro_b16) part_micro micro_b16 120 "${MICRO_B16_ARGS[@]}" ;;
        micro) part_micro micro 300 "${MICRO_ARGS[@]}" ;;
        *) result "$part: UNKNOWN part"
           note "unknown part $part (the parts: ${PLAN[*]}; aliases issue attn_b16 attn_l16 attn_hf all)"
           PART_CUT=1 ;;
    esac
    # every command of the part ran to its end (a failure included: it would fail again): a later call skips it
    [ "$part" != setup ] && [ "$PART_CUT" = 0 ] && ! grep -qx "done: $part" "$PARTS_TXT" && result "done: $part"
done
result "gpu_run call ended after $((SECONDS - START)) s"
{  # every call into this $OUT, in order
    cat "$PARTS_TXT"
    grep -h -E "^  -> |^dataset |[0-9]+ (passed|failed|skipped)" "$LOG" 2>/dev/null | tail -n 80 || true
} | tee "$OUT/summary.txt"
exit 0  # each part's own exit status is in the summary
