"""``bench/profile_attention.py --timeline``, whose CUDA branch only runs on a GPU: checked here on the CPU with
stand-ins for the CUDA calls, so that the first GPU at hand measures instead of failing on a typo."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_profile_attention", ROOT / "bench" / "profile_attention.py")
profile_attention = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_attention)


def test_busy_time_merges_overlapping_kernels_and_gaps_name_the_kernel_before():
    kernels = [(12, 20, "c"), (0, 10, "a"), (5, 8, "b"), (30, 31, "d"), (18, 25, "e")]
    busy, gaps = profile_attention.busy_and_gaps(kernels)
    assert busy == 10 + 13 + 1  # [0, 10], [12, 25], [30, 31]
    assert gaps == [(5, "e"), (2, "a")]  # b ended inside a: the kernel before the first gap is a
    assert profile_attention.busy_and_gaps([]) == (0.0, [])


def test_runtime_calls_are_told_from_kernels_and_operators():
    told = profile_attention._runtime_call
    assert all(told(n) for n in ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaStreamSynchronize", "cudaMalloc"))
    assert not any(told(n) for n in ("cutlass::Kernel2<...>", "aten::bmm", "cublasGemmEx_kernel", "cub_reduce"))


def test_the_timeline_records_each_synchronisation_and_turns_the_debug_mode_off(monkeypatch):
    """The CUDA branch with stand-ins: ``set_sync_debug_mode`` set to warn for one call and back to 0, each warning
    of that call recorded (also when warnings are ignored, as ``bench/gpu_run.sh`` sets them), the profiler's
    figures computed (no CUDA events on the CPU: nothing busy, no runtime calls)."""
    from torch.profiler import ProfilerActivity

    modes: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    calls = []

    def once(method: str) -> torch.Tensor:
        calls.append(method)
        warnings.warn("called a synchronizing CUDA operation\nmore lines", stacklevel=1)  # as torch's C++ warnings
        return torch.ones(4) @ torch.ones(4)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shown = warnings.showwarning
        row = profile_attention.timeline(once, "rollout_kernel", True, 2, [ProfilerActivity.CPU])
        # given back (the profiler's imports may add filters of their own: only the timeline's "always" is checked)
        assert warnings.showwarning is shown and ("always", None, Warning, None, 0) not in warnings.filters
    assert modes == ["warn", 0]
    assert len(calls) == 2 + 2 + 1 + 3  # warm-up, timed, under the debug mode, profiled
    assert [(s["what"], s["at"]) for s in row["syncs"]] == [
        ("called a synchronizing CUDA operation", f"{Path(__file__).name}:{once.__code__.co_firstlineno + 2}")]
    assert row["method"] == "rollout_kernel" and 0 < row["host_ms"] <= row["total_ms"]
    assert row["busy_ms"] == row["kernel_ms"] == 0 and row["runtime"] == {} and row["gaps"] == []


def test_the_debug_mode_is_turned_off_when_the_call_raises(monkeypatch):
    from torch.profiler import ProfilerActivity

    modes: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    count = []

    def once(method: str) -> None:
        count.append(1)
        if len(count) == 5:  # the call under the debug mode
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        profile_attention.timeline(once, "plain", True, 2, [ProfilerActivity.CPU])
    assert modes == ["warn", 0]
