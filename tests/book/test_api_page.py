"""The API reference (book/api.md, an index, and one page per part of the library,
book/api_*.md) documents exactly the public names, attention_lib.__all__, each once.

The page documents a name with an autodoc directive (``autofunction``, ``autoclass``,
``autodata``) or a plain ``py:data`` one, inside ``{eval-rst}`` blocks, under the
module set by the last ``currentmodule`` (or ``automodule``). A name documented in its
submodule (``attention_lib.tiled.tiled_attention``) counts when the package exports the
same object under that name.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import attention_lib

ROOT = Path(__file__).resolve().parents[2]
API_PAGE = ROOT / "book" / "api.md"
# The reference's pages (issue 44, item 6: split from one page of 169 phone screens).
API_PAGES = [API_PAGE, *sorted((ROOT / "book").glob("api_*.md"))]


def reference() -> str:
    """The text of every page of the reference, the index first."""
    return "\n".join(p.read_text(encoding="utf-8") for p in API_PAGES)


EVAL_RST = re.compile(r"^```\{eval-rst\}\n(.*?)^```", re.S | re.M)
DIRECTIVE = re.compile(
    r"^\.\. (currentmodule|automodule|autofunction|autoclass|autodata|autoexception"
    r"|py:function|py:class|py:data)::\s*(\S+)",
    re.M,
)

# Documented in their submodule, which the page says, and deliberately not exported
# from the package: the backends' registry (to add a backend) and their shared pieces,
# the converters (MultiHeadAttention inherits them: from_torch/from_hf_llama), the
# functional core that the entry points call, and the default tile size.
SUBMODULE_ONLY = {
    "attention_lib.backends.BACKENDS",
    "attention_lib.backends.lib_backend",
    "attention_lib.backends.torch_backend",
    "attention_lib.backends.tiled_backend",
    "attention_lib.backends.lib_attention",
    "attention_lib.convert.AttentionConverters",
    "attention_lib.masks.Causal",
    "attention_lib.masks.with_causal",
    "attention_lib.sdpa.attend",
    "attention_lib.tiled.tiled_core",
    "attention_lib.tiled.DEFAULT_BLOCK_SIZE",
    # chapter 14's launcher and its worker, for notebooks, tests and torchrun
    "attention_lib.distributed.launch",
    "attention_lib.distributed.run_cases",
    "attention_lib.distributed.Case",
    "attention_lib.distributed.reference",
    "attention_lib.distributed.gather",
    "attention_lib.dsa.LightningIndexer",
    "attention_lib.dsa.top_k_mask",
    "attention_lib.dsa.attention_target",
    "attention_lib.dsa.indexer_kl_loss",
    "attention_lib.dsa.top_k_recall",
    # chapter 21's mixture of experts (gpt-oss), read as attention_lib.moe.MixtureOfExperts
    "attention_lib.moe.MixtureOfExperts",
    # chapter 20's mask_mod/score_mod builders, read as flex.causal(...), flex.document(...)
    *(
        f"attention_lib.flex.{name}"
        for name in "causal sliding_window chunked padding document prefix_lm tree "
        "from_keep softcap alibi".split()
    ),
    # chapter 16's table of layer types (a new type is one more entry)
    "attention_lib.layer_types.LayerType",
    "attention_lib.layer_types.register_layer_type",
    "attention_lib.layer_types.LAYER_TYPES",
    "attention_lib.layer_types.LayerSpec",
    "attention_lib.layer_types.unregister_layer_type",
    # the protocols every token mixer and per-layer cache follows (issue 34)
    "attention_lib.protocols.TokenMixer",
    "attention_lib.protocols.LayerCache",
    "attention_lib.protocols.Step",
    # chapter 12's engine, piece by piece: its scheduler, block manager and the
    # serving cache's layer groups (documented in their modules)
    "attention_lib.scheduler.Scheduler",
    "attention_lib.block_manager.BlockManager",
    *(
        f"attention_lib.serving_cache.{name}"
        for name in "ServingCache ServingStep PagedLatentCache PagedLatentLayer "
        "StateSlots SlotState PAGED_GROUPS".split()
    ),
    # chapter 18's base of the fixed-state mixers, and DeepSeek-V4's compressor cache
    "attention_lib.gated_deltanet.RecurrentMixer",
    "attention_lib.compressed.CompressorCache",
    # the display kit's result tables, for chapter owners to adopt (issue 44, item 5)
    "attention_lib.show.table.table",
    "attention_lib.show.table.Table",
}


def documented(page: str) -> list[str]:
    """Qualified names of the objects the page documents, in page order."""
    names = []
    for block in EVAL_RST.findall(page):
        module = None
        for kind, target in DIRECTIVE.findall(block):
            if kind in ("currentmodule", "automodule"):
                module = target
            else:
                assert module, f"{kind}:: {target} comes before any currentmodule"
                names.append(target if "." in target else f"{module}.{target}")
    return names


def resolve(qualname: str) -> object:
    module, name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def exported_as(qualname: str) -> str | None:
    """The name in __all__ under which the package exports this object, if any."""
    name = qualname.rsplit(".", 1)[1]
    if name in attention_lib.__all__ and getattr(attention_lib, name) is resolve(qualname):
        return name
    return None


def check(page: str) -> tuple[list[str], list[str], list[str]]:
    """(names of __all__ the page misses, names it documents that are not in __all__,
    names it documents twice)."""
    names = documented(page)
    exported = {exported_as(q) for q in names} - {None}
    missing = [n for n in attention_lib.__all__ if n not in exported]
    extra = [q for q in names if exported_as(q) is None and q not in SUBMODULE_ONLY]
    twice = sorted({q for q in names if names.count(q) > 1})
    return missing, extra, twice


def test_the_parser_reads_the_page() -> None:
    names = documented(reference())
    assert len(names) >= len(attention_lib.__all__) > 30
    assert "attention_lib.causal_mask" in names  # under currentmodule:: attention_lib
    assert "attention_lib.tiled.tiled_attention" in names  # in its submodule
    assert "attention_lib.PUBLISHED_SHAPES" in names  # a plain py:data directive


def test_every_public_name_is_documented_and_nothing_else() -> None:
    missing, extra, twice = check(reference())
    assert missing == [], f"add them to a page of the reference (book/api_*.md): {missing}"
    assert extra == [], f"not in attention_lib.__all__: {extra}"
    assert twice == []


def test_the_submodule_only_names_exist_and_are_documented() -> None:
    names = documented(reference())
    for qualname in SUBMODULE_ONLY:
        resolve(qualname)  # raises if the name is gone from its module
        assert qualname in names
        assert exported_as(qualname) is None  # else it belongs to the general rule


def test_the_check_catches_a_missing_and_an_extra_name() -> None:
    page = reference()
    without = page.replace(".. autofunction:: causal_mask\n", "")
    assert without != page
    assert check(without)[0] == ["causal_mask"]
    extra = page.replace(
        ".. autofunction:: causal_mask\n",
        ".. autofunction:: causal_mask\n\n.. autofunction:: check_mask\n",
    )
    assert check(extra)[1] == ["attention_lib.check_mask"]
    twice = page.replace(
        ".. autofunction:: causal_mask\n",
        ".. autofunction:: causal_mask\n\n.. autofunction:: causal_mask\n",
    )
    assert check(twice)[2] == ["attention_lib.causal_mask"]


def test_the_reference_is_split_into_short_pages() -> None:
    assert len(API_PAGES) >= 5
    index = API_PAGE.read_text(encoding="utf-8")
    assert not documented(index), "the index page lists the pages; the entries are on them"
    for page in API_PAGES[1:]:
        assert page.stem in index, f"the index page does not link {page.name}"
