"""What a user uploads of an export directory is the model, not keras_vit's bookkeeping (issue 47, item 4).

The writer's ownership marker stays inside the directories it writes (it is
what makes the directory swap one step and keeps a user's files); the docs
name it and the pattern that leaves it out of an upload. This test applies
the documented pattern with huggingface_hub's own filter (what `hf upload
--exclude` and `upload_folder(ignore_patterns=...)` use) to a real export.
"""

import os
import re

import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import export_huggingface
from keras_vit.convert.huggingface import HUGGINGFACE_FILES
from keras_vit.writer.ownership import MARKER
from tests.package_source import ROOT

hub_utils = pytest.importorskip("huggingface_hub.utils")


def _page(name):
    with open(os.path.join(os.path.dirname(ROOT), "docs", name), encoding="utf-8") as file:
        return file.read()


def _documented_patterns(page):
    """The `--exclude` patterns and `ignore_patterns` a page tells a user to pass."""
    return set(re.findall(r'--exclude "([^"]+)"', page)) | set(re.findall(r'ignore_patterns=\["([^"]+)"\]', page))


@pytest.mark.one_backend("lists files of an export directory; the names do not depend on the backend")
def test_the_documented_upload_pattern_leaves_exactly_the_model(tmp_path):
    backbone = ViTBackbone(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)
    export_huggingface(ViTClassifier(backbone, num_classes=3), tmp_path / "hf_dir")
    present = sorted(os.listdir(tmp_path / "hf_dir"))
    assert MARKER in present  # the writer's record is there: what the docs tell a user to leave out
    for page in ("converting.md", "deploy.md"):
        patterns = _documented_patterns(_page(page))
        assert patterns, f"docs/{page} should say how to leave {MARKER} out of an upload"
        sent = sorted(hub_utils.filter_repo_objects(present, ignore_patterns=sorted(patterns)))
        assert sent == sorted(HUGGINGFACE_FILES), f"docs/{page}: {sorted(patterns)} uploads {sent}"
