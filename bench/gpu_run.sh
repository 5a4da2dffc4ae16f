#!/usr/bin/env bash
# Every GPU figure of the head-map kernel work in one go, on a bare H100/H200 machine (Python 3.12, torch, timm,
# triton preinstalled; no package index reachable). Run from the repository root:
#
#   OUT=/some/dir bash bench/gpu_run.sh                 # every part (about 27 minutes on an H100: see below)
#   OUT=/some/dir bash bench/gpu_run.sh tests micro     # only some parts (setup always runs first)
#
# Through a device tool that allows 10 minutes per command, four calls (GPU_RUN_DEADLINE_S=570 keeps each inside):
#   GPU_RUN_DEADLINE_S=570 bash bench/gpu_run.sh tests micro    # ~7 min
#   GPU_RUN_DEADLINE_S=570 bash bench/gpu_run.sh attn_b16       # ~5 min
#   GPU_RUN_DEADLINE_S=570 bash bench/gpu_run.sh attn_l16       # ~7 min
#   GPU_RUN_DEADLINE_S=570 bash bench/gpu_run.sh attn_hf dataset   # ~9 min
#
# Parts (in this order by default), each with its own time limit, each going on when an earlier one failed:
#   setup      versions, GPU, vitviz installed (pip install --no-deps -e . offline; else PYTHONPATH), a kernel smoke
#              check, timm from .whl/ when the machine's is older than vitviz's stream probe needs   (~1 min)
#   tests      pytest -m gpu (kernel vs PyTorch path on ViT-B/16 448 px shapes, peak-memory bound, CUDA checks)
#                                                                                                    (~3 min, cap 5)
#   micro      bench/headmap_kernel.py: the kernels alone vs SDPA per layer, block shapes and float32 precision
#              swept (bf16, fp32 = 3xTF32, fp32-ieee; 5 block shapes; JSON written after every case)  (~3 min, cap 5)
#   (bench/attention.py exits 3 when every case ran and a goal was missed, 1 when a case failed)
#   attn_b16   bench/attention.py, ViT-B/16, 224 px (batch 32) and 448 px (batch 8), bf16 and fp32: plain, explicit,
#              store, timm, rollout/distance on the PyTorch stream path and with the kernels, rollout with the
#              forward's log-sum-exp (rollout_fwdlse); one process per dtype and size     (~4 min, cap 4 x 130 s)
#   attn_l16   the same for ViT-L/16                                                          (~6 min, cap 4 x 130 s)
#   attn_hf    a Hugging Face ViTModel of ViT-B/16's size (SDPA; its stream probe, vitviz/core/families/hf_probes.py)
#              and torchvision's vit_b_16 (nn.MultiheadAttention; stream.probe_mha_stream), each at 448 px (batch
#              8), bf16 and fp32, without the timm-only anchor (and torchvision without the forward LSE)
#                                                                                          (~4 min, cap 4 x 130 s)
#   dataset    bench/dataset.py, ViT-B/16 224 px, bf16 autocast, 16,384 synthetic images, batch 256, 4 workers:
#              plain forward, distance (kernel), distance (PyTorch stream path), plain again  (~4 min, cap 4 x 110 s)
#
# Estimates, not measurements (no GPU was at hand when this was written): model creation ~5-15 s per process,
# Triton compilation a few seconds per kernel variant, the timed work seconds per case (see docs/benchmarks.md for
# the earlier H100 figures of the same benchmarks). The whole run: about 27 minutes, within 30.
#
# GPU_RUN_REHEARSAL=1 runs the same parts on the CPU in a minute or two (tests/test_gpu_run.py, in `make test`): tiny
# models and shapes, the kernels under Triton's interpreter, nothing installed; so the script and every command line
# it builds are known to work before a GPU is at hand. Its figures mean nothing.
#
# Output under $OUT (at most 8 files come back from the device machine): env.json, gpu_tests.log, micro.json,
# attention_b16.json, attention_l16.json, attention_hf.json, attention_tv.json, dataset.json, run.log (everything
# printed), summary.txt (last lines). In one call that is 10 files where 8 come back at most: run the parts in the
# four calls above (each call's $OUT is its own), or drop gpu_tests.log and run.log (summary.txt has their ends).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu_run}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
LOG="$OUT/run.log"
START=$SECONDS
DEADLINE_S=${GPU_RUN_DEADLINE_S:-1740}  # stop starting parts after this (29 min; 570 for one 10-minute device call)
declare -a RESULTS=()
# what each part runs on: the GPU, or (GPU_RUN_REHEARSAL=1) the CPU with tiny stand-ins
if [ "${GPU_RUN_REHEARSAL:-0}" = 1 ]; then
    export TRITON_INTERPRET=1
    DEV=cpu REPEATS=1 SMALL=32 LARGE=32 SIZES=32 BATCH_SMALL=2 BATCH_LARGE=2 KERNEL_AUTO=on AMP=off ATTN_EXTRA=(--no-memory)
    B16=vit_tiny_patch16_224 L16=vit_small_patch16_224 DATA_MODEL=cifar10-vit DATA_N=8 DATA_BATCH=4 WORKERS=0
    SMOKE="2 3 37 16"
    MICRO_ARGS=(--device cpu --shapes tiny --dtypes fp32 fp32-ieee --blocks default 16,16,1,1)
else
    DEV=cuda REPEATS=5 SMALL=224 LARGE=448 SIZES="224 448" BATCH_SMALL=32 BATCH_LARGE=8 KERNEL_AUTO=auto AMP=bf16
    ATTN_EXTRA=()
    B16=vit_base_patch16_224 L16=vit_large_patch16_224 DATA_MODEL=vit_base_patch16_224 DATA_N=16384 DATA_BATCH=256
    WORKERS=4 MICRO_ARGS=() SMOKE="2 12 197 64"
fi

note() { echo "[gpu_run +$((SECONDS - START))s] $*" | tee -a "$LOG"; }

# run_part NAME LIMIT_S COMMAND...: runs with a time limit (cut to what is left before DEADLINE_S), output appended
# to run.log (and to $PART_LOG when set); records the exit status; skipped when less than 30 s are left
run_part() {
    local name=$1 limit=$2
    shift 2
    local left=$((DEADLINE_S - (SECONDS - START)))
    if [ "$left" -lt 30 ]; then
        RESULTS+=("$name: SKIPPED (${left}s left of GPU_RUN_DEADLINE_S=$DEADLINE_S)")
        note "--- $name: skipped, ${left}s left"
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    note "--- $name (limit ${limit}s): $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG" ${PART_LOG:+"$PART_LOG"}
    local rc=${PIPESTATUS[0]}
    RESULTS+=("$name: exit $rc after $((SECONDS - START))s")
    note "--- $name: exit $rc"
}

part_setup() {
    if [ "${GPU_RUN_REHEARSAL:-0}" = 1 ]; then
        note "rehearsal on the CPU: nothing installed, tiny models, TRITON_INTERPRET=1"
    elif [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (e.g. a newer timm), as the device docs say
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            && export PYTHONPATH="$PYTHONPATH:/tmp/site" && note "installed carried wheels: $(ls .whl)"
    fi
    [ "${GPU_RUN_REHEARSAL:-0}" = 1 ] || { $PY -m pip install -q --no-index --no-deps --no-build-isolation -e . \
        >>"$LOG" 2>&1 && note "vitviz installed (editable, no deps)" \
        || note "pip install -e . did not work offline: using PYTHONPATH=$PWD"; }
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
    run_part setup 120 $PY - "$OUT/env.json" "$DEV" $SMOKE <<'EOF'
import json, sys, importlib.metadata as md
import torch
info = {"python": sys.version.split()[0], "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
for name in ("torch", "timm", "triton", "transformers", "numpy"):
    try:
        info[name] = md.version(name)
    except md.PackageNotFoundError:
        info[name] = None
import vitviz, timm
from packaging.version import Version
info["vitviz_file"] = vitviz.__file__
info["timm_stream_probe"] = Version(timm.__version__) >= Version("1.0.26")
if not info["timm_stream_probe"]:
    print(f"WARNING: timm {timm.__version__} < 1.0.26: the stream probe (and so the kernels) are off for timm models;"
          " carry a timm>=1.0.26 wheel in .whl/ (see /work/.library/device/README.md)")
from vitviz.core import kernels
info["use_kernel"] = kernels.use_kernel(sys.argv[2])
from vitviz.core.kernels import headmaps
b, h, n, d = (int(v) for v in sys.argv[3:7])  # one layer of ViT-B/16 at 224 px (rehearsal: a tiny one)
q, k = (torch.randn(b, h, n, d, device=sys.argv[2], dtype=torch.bfloat16) for _ in range(2))
ref = (q.double() @ k.double().transpose(-1, -2) * d ** -0.5).softmax(-1).mean(1)
info["smoke_max_abs"] = float((headmaps.fuse_heads_kernel(q, k, d ** -0.5).double() - ref).abs().max())
print(json.dumps(info, indent=1))
json.dump(info, open(sys.argv[1], "w"), indent=1)
sys.exit(0 if info["smoke_max_abs"] < 1e-5 else 1)
EOF
}

part_tests() {
    PART_LOG="$OUT/gpu_tests.log" run_part tests 300 $PY -m pytest -q -p no:cacheprovider -m gpu tests \
        --ignore=tests/browser --ignore=tests/test_report.py -o addopts="-ra" --timeout=240
}

part_micro() {
    run_part micro 300 $PY bench/headmap_kernel.py "${MICRO_ARGS[@]}" --json "$OUT/micro.json"
}

METHODS="plain explicit store timm rollout_torch rollout_kernel rollout_fwdlse store_distance distance_torch
distance_kernel"
METHODS=${METHODS//$'\n'/ }
# Hugging Face: no timm anchor (AttentionExtract); torchvision: nor a forward log-sum-exp (its MultiheadAttention
# runs its attention inside one ATen op, see vitviz/core/kernels/forward_lse.py)
TV_METHODS="plain explicit store rollout_torch rollout_kernel store_distance distance_torch distance_kernel"
HF_METHODS="$TV_METHODS rollout_fwdlse"

part_attn() {  # part_attn TAG MODEL [SIZES [METHODS]]: one process per dtype and size (results appended to the JSON)
    local tag=$1 model=$2 sizes=${3:-$SIZES} methods=${4:-$METHODS} dt size
    rm -f "$OUT/attention_$tag.json"
    for dt in bf16 fp32; do
        for size in $sizes; do
            run_part "attention_${tag}_${dt}_$size" 130 $PY bench/attention.py --device "$DEV" --model "$model" \
                --dtype "$dt" --sizes "$size" --batch "$([ "$size" = "$SMALL" ] && echo "$BATCH_SMALL" || echo "$BATCH_LARGE")" \
                --repeats "$REPEATS" "${ATTN_EXTRA[@]}" \
                --methods $methods --json "$OUT/attention_$tag.json"
        done
    done
}

part_dataset() {
    local json="$OUT/dataset.json" tmp
    tmp=$(mktemp -d)
    local i=0 red kern
    for spec in "plain $KERNEL_AUTO" "distance $KERNEL_AUTO" "distance off" "plain $KERNEL_AUTO"; do
        read -r red kern <<<"$spec"
        i=$((i + 1))
        run_part "dataset_${i}_${red}_$kern" 110 $PY bench/dataset.py --model "$DATA_MODEL" --synthetic "$DATA_N" \
            --device "$DEV" --batch "$DATA_BATCH" --workers "$WORKERS" --autocast "$AMP" --reduction "$red" \
            --kernel "$kern" --warmup "$([ "$DEV" = cuda ] && echo 4 || echo 1)" \
            --json "$tmp/$i.json"
    done
    $PY - "$tmp" "$json" <<'EOF' 2>&1 | tee -a "$LOG"
import json, sys, pathlib
rows = [json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))]
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=1) + "\n")
plain = [r["images_per_s"] for r in rows if r["reduction"] == "plain"]
for r in rows:
    ratio = r["images_per_s"] / max(plain) if plain else float("nan")
    print(f"dataset {r['reduction']:9} kernel={r.get('kernel')} {r['images_per_s']:8.1f} img/s "
          f"({ratio:.0%} of the faster plain run; goal >= 85%) peak {r['peak_mib']:.0f} MiB")
EOF
    rm -rf "$tmp"
}

PARTS=("$@")
[ ${#PARTS[@]} -eq 0 ] && PARTS=(setup tests micro attn_b16 attn_l16 attn_hf dataset)
[ "${PARTS[0]}" != setup ] && PARTS=(setup "${PARTS[@]}")  # versions and the smoke check come first, always
for part in "${PARTS[@]}"; do
    case $part in
        setup) part_setup ;;
        tests) part_tests ;;
        micro) part_micro ;;
        attn_b16) part_attn b16 "$B16" ;;
        attn_l16) part_attn l16 "$L16" ;;
        attn_hf) part_attn hf hf:vit-base-patch16 "$LARGE" "$HF_METHODS"
                 part_attn tv tv:vit_b_16 "$LARGE" "$TV_METHODS" ;;
        dataset) part_dataset ;;
        *) note "unknown part $part (setup tests micro attn_b16 attn_l16 attn_hf dataset)" ;;
    esac
done
{
    echo "gpu_run parts: ${PARTS[*]} ($((SECONDS - START)) s)"
    printf '%s\n' "${RESULTS[@]}"
    grep -h -E "^  -> |^dataset |passed|failed" "$LOG" 2>/dev/null | tail -n 60
} | tee "$OUT/summary.txt"
