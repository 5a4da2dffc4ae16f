"""A model with sharded weights (FSDP, tensor parallelism) is refused, naming what is sharded and how to gather it.

FSDP keeps each rank's shard of the weights and gathers them only inside its forward, a collective every rank must
join; tensor parallelism leaves each rank its share of the heads. Before this refusal, vitviz failed deep inside
DTensor's sharding propagation ("would remove or reshape sharded dimension 0") or, for ``FullyShardedDataParallel``,
said the model had no attention modules. Each case runs in a one-process gloo group on the CPU; the fix the message
names (``get_model_state_dict`` into a model built without sharding) is run and gives the unsharded model's maps.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import vitviz
from vitviz.errors import UnsupportedModelError

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - builds without torch.distributed
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

# FSDP on one rank falls back to NO_SHARD and says so; the classes (and so the refusal) are the same as on many ranks
pytestmark = [pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`"),
              pytest.mark.filterwarnings("ignore:When using ``NO_SHARD``"),
              pytest.mark.filterwarnings("ignore:DTensor random operators may not have complete support")]

SIZE = (32, 48)  # a non-square grid: 2 x 3 patches of 16 px


def _vit() -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=SIZE, num_classes=5, depth=2).eval()


def _images() -> torch.Tensor:
    return torch.randn(2, 3, *SIZE, generator=torch.Generator().manual_seed(1))


def _fully_shard():
    try:  # public from torch 2.6 on; torch 2.5 has it under _composable
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


@pytest.fixture
def mesh():
    """A one-process gloo group (no port: an in-memory store) and its CPU device mesh, destroyed after the test."""
    from torch.distributed.device_mesh import init_device_mesh

    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _fsdp1(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(model, device_id=torch.device("cpu"))


def _fsdp2_all(model: nn.Module, mesh) -> nn.Module:
    fully_shard = _fully_shard()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _fsdp2_blocks(model: nn.Module, mesh) -> nn.Module:
    """Only the blocks sharded: the root is still a plain VisionTransformer."""
    fully_shard = _fully_shard()
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return model


def _tensor_parallel(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    return parallelize_module(model, mesh, {"blocks.0.attn.qkv": ColwiseParallel(),
                                            "blocks.0.attn.proj": RowwiseParallel()})


def _cpu_forward(model: nn.Module, x: torch.Tensor) -> bool:
    """Run the sharded model's forward, or return False where this torch cannot on a CPU mesh (torch 2.5: fully_shard
    "requires CUDA for streams", DTensor's einsum strategy fails on a CPU mesh); later versions must run it."""
    try:
        with torch.no_grad():
            model(x)
    except (RuntimeError, IndexError):
        if torch.__version__ >= "2.6":  # a TorchVersion: compared as a version, not as a string
            raise
        return False
    return True


SHARDINGS = {
    "FullyShardedDataParallel": (_fsdp1, r"FullyShardedDataParallel: the model is sharded with FSDP "
                                         r"\(FullyShardedDataParallel, over a VisionTransformer\)"),
    "fully_shard": (_fsdp2_all, r"FSDPVisionTransformer: the model is sharded with FSDP \(fully_shard, over a "
                                r"VisionTransformer\)"),
    "fully_shard-blocks": (_fsdp2_blocks, r"VisionTransformer: its submodule 'blocks.0' is sharded with FSDP "
                                          r"\(fully_shard, over a Block\)"),
    "tensor-parallel": (_tensor_parallel, r"VisionTransformer: 'blocks.0.attn.qkv.weight' is a DTensor .*share "
                                          r"of the heads"),
}

ENTRY_POINTS = {
    "inspect": lambda m, x: vitviz.inspect(m),
    "rollout": lambda m, x: vitviz.explain(m, x, method="rollout"),
    "distance": lambda m, x: vitviz.mean_attention_distance(m, x),
    "attnlrp": lambda m, x: vitviz.attnlrp(m, x),
    "pos_embed_similarity": lambda m, x: vitviz.pos_embed_similarity(m),
    "embedding_filters": lambda m, x: vitviz.embedding_filters(m),
    "capture": lambda m, x: vitviz.capture_attention(m).__enter__(),
}


@pytest.mark.parametrize("sharding", list(SHARDINGS))
def test_sharded_model_is_refused_naming_what_is_sharded_and_the_gather(mesh, sharding):
    shard, names = SHARDINGS[sharding]
    model = shard(_vit(), mesh)
    x = _images()
    for state in ("before a forward", "after a forward"):  # FSDP leaves some weights gathered after its forward
        if state == "after a forward" and not _cpu_forward(model, x):
            break
        for entry, call in ENTRY_POINTS.items():
            with pytest.raises(UnsupportedModelError, match=names) as refused:
                call(model, x)
            assert "get_model_state_dict" in str(refused.value) and "full_state_dict=True" in str(refused.value), \
                (state, entry)
    else:
        # count_flops counts any module's forward (a ResNet's too) by running it as the user's own forward would:
        # with an input size given, a sharded model is counted, and counts as the unsharded one (gathers are no FLOPs)
        assert vitviz.count_flops(model, (3, *SIZE)) == vitviz.count_flops(_vit(), (3, *SIZE))


@pytest.mark.parametrize("sharding", ["FullyShardedDataParallel", "fully_shard", "tensor-parallel"])
def test_the_gather_the_refusal_names_gives_the_unsharded_models_maps(mesh, sharding):
    """The fix in the message, run as written: the gathered weights in a model built without sharding give the maps
    and the AttnLRP relevance of the model before it was sharded. (The models without sharding are read inside the
    process group: a group alone, the data-parallel set-up vitviz shards datasets over, is no refusal.)"""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    plain = _vit()
    x = _images()
    sharded = SHARDINGS[sharding][0](copy.deepcopy(plain), mesh)
    sd = get_model_state_dict(sharded, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    gathered = _vit()
    torch.nn.init.zeros_(gathered.pos_embed)  # so that a weight left unloaded shows
    gathered.load_state_dict(sd)
    torch.testing.assert_close(vitviz.explain(gathered, x, method="rollout"), vitviz.explain(plain, x, method="rollout"))
    torch.testing.assert_close(vitviz.attnlrp(gathered, x), vitviz.attnlrp(plain, x))
    torch.testing.assert_close(vitviz.pos_embed_similarity(gathered), vitviz.pos_embed_similarity(plain))

