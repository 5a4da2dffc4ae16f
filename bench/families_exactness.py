"""Max abs difference between vitviz's captured attention and an independent reference, per family.

Hugging Face: the same weights' ``output_attentions=True`` under the eager implementation (a separate copy; the
model under analysis keeps SDPA). open_clip: ``softmax(q k^T / sqrt(d))`` recomputed in float64 from each
``nn.MultiheadAttention``'s ``in_proj``. Tiny random-weight models from tests/hf_models.py.

    python bench/families_exactness.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hf_models import HF_CASES, hf_case, mha_reference, open_clip_model, open_clip_tower  # noqa: E402
from test_capture import record_inputs  # noqa: E402

import vitviz  # noqa: E402


def max_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))


def main() -> None:
    torch.manual_seed(0)
    print(f"{'family':<20} {'max |capture - reference|':>26}")
    for name in HF_CASES:
        case = hf_case(name)
        with torch.no_grad(), vitviz.capture_attention(case.model) as cap:
            case.run(case.model, case.x)
        print(f"{name:<20} {max_diff(cap.attentions, case.reference(case.model, case.x)):>26.2e}")
    try:
        import open_clip  # noqa: F401
    except ImportError:
        print("open_clip not installed: skipped")
        return
    for name, model in (("open_clip-tower", open_clip_tower()), ("open_clip-CLIP", open_clip_model())):
        visual = getattr(model, "visual", model)
        mhas = [b.attn for b in visual.transformer.resblocks]
        x = torch.randn(2, 3, 32, 48)
        with record_inputs(mhas) as seen, torch.no_grad(), vitviz.capture_attention(model) as cap:
            model(x)
        print(f"{name:<20} {max_diff(cap.attentions, mha_reference(mhas, seen)):>26.2e}")


if __name__ == "__main__":
    main()
