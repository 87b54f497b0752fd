"""Every figure renders to a non-empty PNG of the size asked for.

In one pass: the figures are drawn by matplotlib from numpy arrays. The
arrays each backend computes are checked on every backend against numpy
(tests/inspection/test_attention.py: attention maps and rollout of these
three tiny models; test_distance.py: figure 7's numbers, hybrid included), and
`keras-vit explain` draws every figure on every backend (test_explain.py).
"""

import struct
import sys

import numpy as np
import pytest

from keras_vit import inspection
from tests.inspection.helpers import build, images_for

pytestmark = pytest.mark.one_backend("the figures are drawn by matplotlib from numpy arrays")


def png_size(path):
    with open(path, "rb") as file:
        header = file.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


def check_png(path, size):
    from matplotlib.image import imread

    assert png_size(path) == size
    pixels = imread(str(path))
    assert pixels.shape[:2] == (size[1], size[0])
    assert pixels[..., :3].std() > 0.05  # something was drawn


@pytest.fixture(scope="module")
def class_model():
    backbone, _ = build("class_registers_nonsquare")
    images = images_for(backbone)
    return backbone, images, inspection.attention_maps(backbone, images)


def test_rollout_figure(class_model, tmp_path):
    backbone, images, maps = class_model
    rollout = inspection.attention_rollout(maps)
    path = inspection.save_figure(inspection.plot_rollout(images[0], rollout.image[0], title="a"), tmp_path / "r.png")
    check_png(path, (1000, 360))
    # A coarse (rows, cols) map is upsampled to the image.
    check_png(inspection.save_figure(inspection.plot_rollout(images[1], rollout.grid[1], dpi=50), tmp_path / "g.png"),
              (500, 180))


def test_attention_maps_figure(class_model, tmp_path):
    _, images, maps = class_model
    figure = inspection.plot_attention_maps(images[1], maps, index=1)
    path = inspection.save_figure(figure, tmp_path / "a.png")
    # 2 heads, 2 blocks: (1.1 * 2 + 1.5) x (1.1 * 2 + 0.8) inches at 100 dpi.
    check_png(path, (370, 300))


def test_figure7_panels(class_model, tmp_path):
    backbone, _, maps = class_model
    panels = inspection.figure7(backbone, maps=maps)
    check_png(inspection.save_figure(panels.plot(title="t"), tmp_path / "f7.png"), (1500, 500))
    check_png(inspection.save_figure(inspection.plot_patch_embedding_components(panels.components), tmp_path / "c.png"),
              (500, 500))
    check_png(inspection.save_figure(inspection.plot_position_similarity(panels.similarity), tmp_path / "s.png"), (500, 500))
    check_png(inspection.save_figure(
        inspection.plot_mean_attention_distance(panels.mean_attention_distance, max_distance=panels.image_diagonal, dpi=80),
        tmp_path / "d.png"), (400, 320))
    numbers = panels.to_dict()
    assert np.shape(numbers["mean_attention_distance_pixels"]) == (2, 2)


def test_grayscale_and_hybrid_figures(tmp_path):
    gap, _ = build("gap_no_class_token")  # 1-channel images, no class token
    maps = inspection.attention_maps(gap, images_for(gap, count=1))
    check_png(inspection.save_figure(inspection.plot_attention_maps(images_for(gap)[0], maps), tmp_path / "a.png"),
              (370, 300))
    check_png(inspection.save_figure(inspection.figure7(gap, maps=maps).plot(), tmp_path / "g.png"), (1500, 500))
    hybrid, _ = build("hybrid")
    panels = inspection.figure7(hybrid, images_for(hybrid, count=1))
    check_png(inspection.save_figure(panels.plot(), tmp_path / "h.png"), (1500, 500))
    with pytest.raises(ValueError, match="hybrid"):
        inspection.plot_patch_embedding_components(inspection.patch_embedding_components(hybrid))


def test_missing_matplotlib_names_the_extra(monkeypatch, class_model):
    _, images, maps = class_model
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install matplotlib"):
        inspection.plot_attention_maps(images[0], maps)
    # The arrays need no plotting library.
    assert inspection.attention_rollout(maps).image.shape == (2, 8, 12)


def test_save_is_atomic(class_model, tmp_path):
    _, images, maps = class_model
    target = tmp_path / "kept.png"
    target.write_bytes(b"old")

    class Broken:
        dpi = 100

        def savefig(self, *args, **kwargs):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        inspection.save_figure(Broken(), target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.png"]
