"""load_images: tensors, PIL, arrays and paths; grayscale and RGBA converted; wrong sizes explained."""

from __future__ import annotations

import math

import numpy as np
import pytest
import timm
import torch
from conftest import tiny_timm_vit
from PIL import Image
from timm.data import create_transform, resolve_data_config

import vitviz
from vitviz.zoo.reference import CIFAR10_MEAN, CIFAR10_STD, build_reference


@pytest.fixture
def rgb_array():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(40, 50, 3), dtype=np.uint8)


def test_pil_array_and_path_agree_with_timm_transform(tmp_path, rgb_array):
    model = timm.create_model("vit_tiny_patch16_224", img_size=64)
    path = tmp_path / "im.png"
    Image.fromarray(rgb_array).save(path)
    cfg = {**resolve_data_config(model=model), "input_size": (3, 64, 64)}  # the size it was built for
    want = create_transform(**cfg)(Image.fromarray(rgb_array))
    batch = vitviz.load_images(model, [Image.fromarray(rgb_array), rgb_array, path, str(path)])
    assert batch.shape == (4, 3, 64, 64) and batch.dtype == torch.float32
    for x in batch:
        torch.testing.assert_close(x, want)


def test_reference_model_uses_its_cifar_config():
    model = build_reference("cifar10-vit")
    img = np.full((32, 32, 3), 255, dtype=np.uint8)
    x = vitviz.load_images(model, img)
    want = (1.0 - torch.tensor(CIFAR10_MEAN)) / torch.tensor(CIFAR10_STD)
    torch.testing.assert_close(x[0, :, 5, 5], want)


def test_cnn_baseline_is_preprocessed_from_its_pretrained_cfg(rgb_array):
    """The cifar10-resnet baseline is no ViT, but its pretrained_cfg still drives load_images; a bare CNN is refused."""
    model = build_reference("cifar10-resnet")
    x = vitviz.load_images(model, [rgb_array, np.full((32, 32, 3), 255, dtype=np.uint8)])
    assert x.shape == (2, 3, 32, 32)  # resized from 40x50 to the config's 32x32
    want = (1.0 - torch.tensor(CIFAR10_MEAN)) / torch.tensor(CIFAR10_STD)
    torch.testing.assert_close(x[1, :, 5, 5], want)
    with pytest.raises(vitviz.NotAViTError, match="not a Vision Transformer"):
        vitviz.load_images(torch.nn.Conv2d(3, 8, 3), rgb_array)


def test_grayscale_and_rgba_are_converted(rgb_array):
    model = tiny_timm_vit()
    gray = rgb_array[..., 0]
    rgba = np.concatenate([rgb_array, np.full((40, 50, 1), 255, np.uint8)], axis=-1)
    out = vitviz.load_images(model, [gray, gray[..., None], rgba, Image.fromarray(gray), Image.fromarray(rgba)])
    assert out.shape == (5, 3, 32, 48)
    torch.testing.assert_close(out[2], vitviz.load_images(model, rgb_array)[0])
    torch.testing.assert_close(out[0, 0] * 0.229 + 0.485, out[0, 1] * 0.224 + 0.456, atol=1e-5, rtol=0)


def test_tensor_of_wrong_size_names_both_sizes_and_the_fix():
    model = tiny_timm_vit()
    with pytest.raises(vitviz.ImageInputError) as err:
        vitviz.load_images(model, torch.randn(2, 3, 48, 48))
    msg = str(err.value)
    assert "32x48" in msg and "48x48" in msg and "img_size=" in msg and "dynamic_img_size=True" in msg


@pytest.mark.parametrize(("channels", "word"), [(1, "grayscale"), (4, "RGBA")])
def test_tensor_with_wrong_channels(channels, word):
    with pytest.raises(vitviz.ImageInputError, match=word):
        vitviz.load_images(tiny_timm_vit(), torch.randn(1, channels, 32, 48))


def test_a_channel_last_tensor_is_named_channel_last_on_every_input_path():
    """A (B, H, W, 3) batch (numpy images turned into tensors, a Dataset yielding H x W x 3 arrays) was called a
    "32-channel tensor" with the grayscale / RGBA fix; on every input path the message now names the channel-last
    layout and the permute that fixes it, as a channel-first array's names its transpose."""
    from torch.utils.data import DataLoader, Dataset

    class ChannelLast(Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return np.random.default_rng(i).random((32, 48, 3)).astype(np.float32), i

    model = tiny_timm_vit()
    x = torch.randn(2, 32, 48, 3)
    fix = r"images: got a tensor of shape \((2|1), 32, 48, 3\), laid out channel-last.*x\.permute\(0, 3, 1, 2\)"
    for source in (x, x[0], ChannelLast(), DataLoader(ChannelLast(), batch_size=2)):
        with pytest.raises(vitviz.ImageInputError, match=fix):
            vitviz.mean_attention_distance(model, source)
    with pytest.raises(vitviz.ImageInputError, match=fix):
        vitviz.load_images(model, x)
    # once permuted it is the batch itself
    torch.testing.assert_close(vitviz.load_images(model, x.permute(0, 3, 1, 2)), x.permute(0, 3, 1, 2))


def test_uint8_tensor_and_bad_objects_are_refused(tmp_path):
    model = tiny_timm_vit()
    with pytest.raises(vitviz.ImageInputError, match="uint8"):
        vitviz.load_images(model, torch.zeros(1, 3, 32, 48, dtype=torch.uint8))
    with pytest.raises(vitviz.ImageInputError, match="not found"):
        vitviz.load_images(model, tmp_path / "missing.jpg")
    with pytest.raises(vitviz.ImageInputError, match="shape"):
        vitviz.load_images(model, np.zeros((3, 32, 48), np.uint8))
    (tmp_path / "notimage.jpg").write_text("hello")
    with pytest.raises(vitviz.ImageInputError, match="cannot read image"):
        vitviz.load_images(model, tmp_path / "notimage.jpg")


def test_dynamic_models_take_other_sizes_but_not_off_stride():
    model = tiny_timm_vit(dynamic_img_size=True)
    assert vitviz.load_images(model, torch.randn(3, 64, 16)).shape == (1, 3, 64, 16)
    with pytest.raises(vitviz.ImageInputError, match=r"multiples of its 8x8 token stride, got 60x16"):
        vitviz.load_images(model, torch.randn(1, 3, 60, 16))


def test_batch_follows_model_dtype():
    model = tiny_timm_vit().to(torch.bfloat16)
    assert vitviz.load_images(model, torch.randn(1, 3, 32, 48)).dtype == torch.bfloat16


def test_a_batch_array_is_its_images_on_every_path(rgb_array):
    """A ``(B, H, W, 3)`` array (``np.stack`` of images, CIFAR's ``.data``) is ``B`` images: the same batch as the
    list of its arrays, counted as ``B`` by every reduction that batches it."""
    from vitviz.core.batching import count_images, iter_batches

    model = tiny_timm_vit()
    rng = np.random.default_rng(1)
    stack = rng.integers(0, 256, size=(3, 32, 48, 3), dtype=np.uint8)
    want = vitviz.load_images(model, list(stack))
    torch.testing.assert_close(vitviz.load_images(model, stack), want)
    assert count_images(stack) == 3 and count_images(list(stack)) == 3 and count_images(rgb_array) == 1
    assert [x.shape[0] for x in iter_batches(model, stack, 2)] == [2, 1]
    torch.testing.assert_close(vitviz.attention_rollout(model, stack), vitviz.attention_rollout(model, want))
    gray = stack[..., :1]  # (B, H, W, 1): grayscale images, converted to RGB like a list of them
    torch.testing.assert_close(vitviz.load_images(model, gray), vitviz.load_images(model, list(gray)))


def test_a_batch_array_is_digested_per_image_for_resume():
    """A resumed faithfulness run checks each image's pixels: a ``(B, H, W, 3)`` array gets the digests of its
    ``B`` images, the same as the list of them, so changing one image is caught on resume."""
    from vitviz.analysis.faithfulness_resume import image_digests

    stack = np.random.default_rng(2).integers(0, 256, size=(3, 8, 8, 3), dtype=np.uint8)
    digests = image_digests(stack, lambda p: p, 3)
    assert digests == image_digests(list(stack), lambda p: p, 3) and len(set(digests.values())) == 3
    changed = stack.copy()
    changed[1, 0, 0, 0] ^= 1
    assert image_digests(changed, lambda p: p, 3)["1"] != digests["1"]
    assert image_digests(stack.transpose(0, 3, 1, 2), lambda p: p, 3) == {}  # refused by the run itself


def test_a_batch_a_caller_checked_is_not_read_again_while_unwritten(monkeypatch):
    """``contexts.input_checked(x)``: inside the block ``check_tensor`` reads nothing of that very tensor (its
    finiteness was checked by the caller; on a GPU the read would wait for every queued kernel), but reads, and
    refuses, as ever: after an in-place write to it (its version counter moved), for a view of it or another tensor,
    for an inference tensor (no version counter) and outside the block. Its shape and dtype are checked inside too."""
    from host_reads import ValueReads

    from vitviz.core.contexts import input_checked
    from vitviz.core.images import check_tensor
    from vitviz.errors import ImageInputError

    x = torch.randn(2, 3, 8, 8)

    def reads(t: torch.Tensor) -> int:
        events = ValueReads(monkeypatch)
        with events:
            check_tensor(t)
        return len(events.reads())

    with input_checked(x):
        assert reads(x) == 0
        assert reads(x[:1]) == 1 and reads(x.clone()) == 1  # a view, another tensor: read
        with pytest.raises(ImageInputError, match="tensor of shape"):
            check_tensor(x[:, :1])  # the shape is checked as ever
        x[0, 0, 0, 0] = float("nan")  # written in place: read again, and refused
        with pytest.raises(ImageInputError, match="1 NaN"):
            check_tensor(x)
    x = torch.randn(2, 3, 8, 8)
    assert reads(x) == 1  # outside the block
    with torch.inference_mode():
        frozen = torch.randn(2, 3, 8, 8)
    with input_checked(frozen):
        assert reads(frozen) == 1  # no version counter to tell a write by: read


FINITE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@pytest.mark.parametrize("dtype", FINITE_DTYPES, ids=str)
def test_the_value_range_tells_finiteness_as_isfinite_does(dtype):
    """``value_range`` (one ``aminmax``, one read) gives the batch's smallest and largest value, and a non-finite
    bound exactly where ``torch.isfinite(x).all()`` is False: a NaN, either infinity, both infinities, anywhere in
    the batch (``aminmax`` propagates NaN); the largest finite values of the dtype pass; an empty tensor passes."""
    from vitviz.core.images import value_range

    big = torch.finfo(dtype).max
    cases = {"clean": torch.randn(2, 3, 5, 7)}
    for name, value in (("nan", float("nan")), ("+inf", float("inf")), ("-inf", float("-inf"))):
        for where in (0, 105, 209):  # the first, a middle and the last value
            t = torch.randn(2, 3, 5, 7)
            t.view(-1)[where] = value
            cases[f"{name} at {where}"] = t
    both = torch.randn(2, 3, 5, 7)
    both[0, 0, 0, 0], both[1, 1, 1, 1] = float("inf"), float("-inf")
    cases["+inf and -inf"] = both
    cases["largest finite"] = torch.full((2, 3, 5, 7), big, dtype=dtype)
    cases["empty"] = torch.empty(0, 3, 5, 7)
    for name, t in cases.items():
        t = t.to(dtype)
        lo, hi = value_range(t)
        assert (math.isfinite(lo) and math.isfinite(hi)) == bool(torch.isfinite(t).all()), (name, dtype)
        if t.numel() and bool(torch.isfinite(t).all()):
            assert (lo, hi) == (float(t.min()), float(t.max())), (name, dtype)


@pytest.mark.parametrize("dtype", FINITE_DTYPES, ids=str)
def test_the_input_check_forms_no_tensor_the_size_of_the_input(dtype):
    """``check_tensor`` on a finite batch dispatches one reduction over it (``aminmax``) and one read of its two
    values: no elementwise op whose output is as large as the input (``torch.isfinite(x).all()`` formed an ``abs`` copy and
    three boolean tensors of the input's size: 14 MB beside a bf16 ViT-B/16 batch of 8 at 448 px, and five kernel
    launches on a GPU instead of one)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from vitviz.core.images import check_tensor

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            numel = out.numel() if isinstance(out, torch.Tensor) else 0
            self.seen.append((str(func.overloadpacket.__name__), numel))
            return out

    x = torch.randn(2, 3, 16, 16).to(dtype)
    with Ops() as ops:
        check_tensor(x)
    assert [name for name, _ in ops.seen] == ["aminmax", "stack"], ops.seen  # then one tolist: the read
    assert all(numel < x.numel() for _, numel in ops.seen), ops.seen


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FINITE_DTYPES, ids=str)
def test_the_value_range_on_cuda_tells_finiteness_as_isfinite_does(dtype):
    """On a CUDA batch (a reduction that reads half types as they are) a NaN or an infinity anywhere gives a
    non-finite bound, the largest finite values pass, and the bounds are the batch's; also in a 448 px batch of 8,
    where the reduction runs in many blocks."""
    from vitviz.core.images import value_range

    for shape in ((2, 3, 5, 7), (8, 3, 448, 448)):
        clean = torch.randn(*shape, device="cuda").to(dtype)
        assert value_range(clean) == (float(clean.min()), float(clean.max()))
        big = torch.finfo(dtype).max
        assert value_range(torch.full(shape, big, dtype=dtype, device="cuda")) == (big, big)
        for value in (float("nan"), float("inf"), float("-inf")):
            for where in (0, clean.numel() // 2, clean.numel() - 1):
                t = clean.clone()
                t.view(-1)[where] = value
                lo, hi = value_range(t)
                assert not (math.isfinite(lo) and math.isfinite(hi)) and not bool(torch.isfinite(t).all())


def test_unnormalised_pixels_are_warned_about_on_every_input_path():
    """Values far beyond a normalised image's range (0-255 pixels given as floats) are warned about
    (``ImageRangeWarning``, naming the range and the fix) on a tensor, a Dataset and a DataLoader alike; a
    normalised batch, and a normal draw of test values, are not."""
    import warnings

    from torch.utils.data import DataLoader, TensorDataset

    from vitviz.errors import ImageRangeWarning

    model = tiny_timm_vit()
    raw = torch.rand(3, 3, 32, 48) * 255
    for images in (raw, TensorDataset(raw), DataLoader(TensorDataset(raw), batch_size=2)):
        with pytest.warns(ImageRangeWarning, match=r"values from .* to 25\d.*0-255 pixels given as floats"):
            vitviz.mean_attention_distance(model, images)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImageRangeWarning)
        vitviz.mean_attention_distance(model, torch.randn(3, 3, 32, 48))
        vitviz.attention_rollout(model, (torch.rand(3, 3, 32, 48) - 0.485) / 0.229)


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
TO_TENSOR_FIX = (r"images: values from [\d.e-]+ to [\d.]+, none negative: pixels in \[0, 1\] \(torchvision's ToTensor\(\) "
                 r"without Normalize\?\), while VisionTransformer's preprocessing normalises them with mean "
                 r"\(0\.485, 0\.456, 0\.406\) and std \(0\.229, 0\.224, 0\.225\).*Normalize\(mean=\(0\.485, 0\.456, "
                 r"0\.406\), std=\(0\.229, 0\.224, 0\.225\)\).*vitviz\.load_images.*A model that normalises its own "
                 r"input can ignore this")


def test_to_tensor_pixels_for_a_model_that_normalises_are_warned_about_once_per_call():
    """Pixels in [0, 1] (``ToTensor()`` without ``Normalize``) passed silently, and every map described another
    input. For a model whose preprocessing normalises, a batch with no negative value and none above 1 is warned
    about (``ImageRangeWarning`` naming the range, the model's mean and std and the fix) on a tensor, a Dataset
    and a DataLoader (``reduce_dataset``) and per-image dataset reads (``iter_dataset``), once per call however many
    batches it reads."""
    from torch.utils.data import DataLoader, TensorDataset

    from vitviz.core.datasets import iter_dataset
    from vitviz.errors import ImageRangeWarning

    model = tiny_timm_vit()
    pixels = torch.rand(5, 3, 32, 48, generator=torch.Generator().manual_seed(0))
    with pytest.warns(ImageRangeWarning, match=TO_TENSOR_FIX) as seen:
        vitviz.load_images(model, pixels)
    assert len(seen) == 1 and seen[0].filename == __file__  # at the caller's line
    for images in (pixels, TensorDataset(pixels), DataLoader(TensorDataset(pixels), batch_size=2)):
        with pytest.warns(ImageRangeWarning, match=TO_TENSOR_FIX) as seen:
            vitviz.mean_attention_distance(model, images, batch_size=2)
        assert sum(issubclass(w.category, ImageRangeWarning) for w in seen) == 1, images  # 3 batches, one warning
    with pytest.warns(ImageRangeWarning, match=TO_TENSOR_FIX) as seen:
        assert len(list(iter_dataset(model, TensorDataset(pixels), batch_size=2))) == 3
    assert sum(issubclass(w.category, ImageRangeWarning) for w in seen) == 1


def test_a_normalised_batch_or_a_model_that_does_not_normalise_is_not_warned_about():
    """The ``ToTensor()`` warning needs both: a batch with no negative value and none above 1, and a model whose
    preprocessing normalises. The same pixels normalised, or given to a model whose data config has mean 0 and
    std 1, are not warned about, on the tensor and the dataset paths."""
    import warnings

    from torch.utils.data import DataLoader, TensorDataset

    from vitviz.errors import ImageRangeWarning

    pixels = torch.rand(4, 3, 32, 48, generator=torch.Generator().manual_seed(1))
    normalised = (pixels - torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)) / torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    model = tiny_timm_vit()
    plain = tiny_timm_vit()
    plain.pretrained_cfg = {"mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ImageRangeWarning)
        for m, x in ((model, normalised), (plain, pixels)):
            vitviz.load_images(m, x)
            vitviz.mean_attention_distance(m, TensorDataset(x), batch_size=2)
            vitviz.mean_attention_distance(m, DataLoader(TensorDataset(x), batch_size=2))
    with pytest.warns(ImageRangeWarning, match=TO_TENSOR_FIX):  # the model's config is what tells
        vitviz.load_images(model, pixels)


def _size_cases():
    from torchvision.models.vision_transformer import VisionTransformer as TorchvisionViT

    cases = [("timm", tiny_timm_vit, r"timm\.create_model\(\.\.\., img_size=\(32, 32\)\) or dynamic_img_size=True"),
             ("torchvision", lambda: TorchvisionViT(image_size=32, patch_size=8, num_layers=1, num_heads=2,
                                                    hidden_dim=16, mlp_dim=32).eval(),
              r"torchvision's vit_\*\(image_size=N\), square inputs only")]
    try:
        import transformers as T

        cases.append(("huggingface", lambda: T.ViTModel(T.ViTConfig(
            image_size=(32, 48), patch_size=8, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32)).eval(), r"its config's image_size=\(32, 32\) when you build it"))
    except ImportError:
        pass
    return cases


@pytest.mark.parametrize("family, build, fix", _size_cases(), ids=[c[0] for c in _size_cases()])
def test_a_size_the_model_does_not_take_names_the_argument_and_its_familys_fix(family, build, fix):
    """The refusal of an input size names ``images``, the size the model takes and how a model of its own family is
    built for the size given (it told every family to call timm's ``create_model``); a model whose grid follows its
    input is told the stride."""
    model = build()
    spec = vitviz.inspect(model)
    assert spec.family == family
    x = torch.randn(1, 3, 32, 32) if tuple(spec.img_size) != (32, 32) else torch.randn(1, 3, 32, 48)
    h, w = x.shape[-2:]
    fix = fix if (h, w) == (32, 32) else fix.replace("32, 32", "32, 48")
    with pytest.raises(vitviz.ImageInputError, match=rf"^images: .*takes {spec.img_size[0]}x{spec.img_size[1]} "
                                                     rf"images, got {h}x{w}.*{fix}"):
        vitviz.attention_rollout(model, x)
    dynamic = tiny_timm_vit(dynamic_img_size=True)
    with pytest.raises(vitviz.ImageInputError, match=r"^images: .*multiples of its 8x8 token stride, got 30x48"):
        vitviz.attention_rollout(dynamic, torch.randn(1, 3, 30, 48))


def test_a_16_bit_image_is_refused_alike_as_a_path_a_pil_image_a_folder_and_an_array(tmp_path):
    """PIL's convert("RGB") clips a 16-bit image at 255 (a photo came out white) where its array was refused: every
    path now reads such an image as the array of its values, with the array's message and fix."""
    from vitviz.core.datasets import ImageFolder
    from vitviz.errors import ImageInputError

    values = (np.arange(32 * 32, dtype=np.uint16).reshape(32, 32) * 60)
    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "wide.png"
    Image.fromarray(values).save(path)
    model = build_reference("cifar10-vit")
    # Pillow opens a 16-bit PNG as mode I;16 (uint16 values), or as mode I (int32) in older releases (10.1)
    match = r"images: an image array of dtype (uint16|int32) has values from 0 to \d+, outside 0..255.*arr / 257"
    for given in (path, str(path), Image.open(path), values):
        with pytest.raises(ImageInputError, match=match):
            vitviz.load_images(model, [given])
    with pytest.raises(ImageInputError, match=match):
        ImageFolder(tmp_path, model)[0]
    low = values // 257  # within 0..255: read as that array is
    Image.fromarray(low.astype(np.uint16)).save(path)
    torch.testing.assert_close(vitviz.load_images(model, [path]), vitviz.load_images(model, [low.astype(np.uint8)]))


def test_an_unreadable_file_in_a_folder_gets_the_message_of_its_path(tmp_path):
    from vitviz.core.datasets import ImageFolder
    from vitviz.errors import ImageInputError

    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.jpg").write_bytes(b"not an image")
    with pytest.raises(ImageInputError, match=r"images: cannot read image '.*x.jpg'"):
        ImageFolder(tmp_path, build_reference("cifar10-vit"))[0]


def test_a_float_image_just_above_1_is_refused_not_read_as_0_to_255():
    """A 0..1 float image that overshoots 1 a little (bicubic resizing gives 1.02) was read as a 0..255 image, so it
    came out nearly black (its brightest pixel 1 of 255) without a word. It is refused, naming its range and both
    fixes; clipped, it is the 0..1 image; a float 0..255 image is read as before."""
    model = tiny_timm_vit()
    rng = np.random.default_rng(0)
    img = rng.random((32, 48, 3)).astype(np.float32)
    over = img.copy()
    over[0, 0, 0] = 1.02
    with pytest.raises(vitviz.ImageInputError, match=r"images: a float image array with values from [\d.e-]+ to "
                                                     r"1\.02 is neither 0\.\.1.*np\.clip\(arr, 0, 1\)"):
        vitviz.load_images(model, over)
    clipped = vitviz.load_images(model, np.clip(over, 0, 1))
    torch.testing.assert_close(clipped[0, :, 1:], vitviz.load_images(model, img)[0, :, 1:])
    wide = (img * 255).round()
    torch.testing.assert_close(vitviz.load_images(model, wide), vitviz.load_images(model, wide.astype(np.uint8)))
