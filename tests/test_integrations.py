"""attngen's integrations import without torch and transformers, and say clearly what is missing
when a function of them needs one (the GPU tests are tests/test_gpu_integrations.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_integrations_import_without_torch_or_transformers():
    code = ("import sys, attngen, attngen.integrations.sdpa as s, attngen.integrations.hf as h; "
            "assert not s.enabled(); print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture
def no_torch(monkeypatch):
    for name in ("torch", "torch.nn", "torch.nn.attention", "transformers", "transformers.masking_utils"):
        monkeypatch.setitem(sys.modules, name, None)


def test_enable_without_torch_says_what_to_install(no_torch):
    import attngen
    from attngen.integrations import sdpa
    for call in (attngen.enable, sdpa.enable, sdpa.register):
        with pytest.raises(ImportError, match="needs torch: pip install"):
            call()
    assert not sdpa.enabled()
    attngen.disable()     # nothing to undo: no error


def test_hf_register_without_transformers_says_so(no_torch):
    from attngen.integrations import hf
    with pytest.raises(ImportError, match="needs transformers with AttentionInterface"):
        hf.register()


def test_hf_attention_refuses_dropout_clearly():
    from attngen.integrations import hf
    with pytest.raises(ValueError, match="no attention dropout .* attention_dropout to 0.0"):
        hf.attention(None, None, None, None, None, dropout=0.1)
