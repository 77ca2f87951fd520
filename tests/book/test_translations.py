"""The Chinese edition's catalogs (locale/zh_CN): complete, not fuzzy, not stale.

The checks themselves live in tools/i18n.py (``python tools/i18n.py check`` prints the same
problems); the last tests here show that each check can fail.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import i18n  # noqa: E402

CATALOGS = i18n.catalog_paths("zh_CN")


def test_every_page_of_the_toc_has_a_catalog() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "book"))
    from book_urls import toc_entries

    pages = set(toc_entries(ROOT / "_toc.yml"))
    assert {i18n.docname(p) for p in CATALOGS} == pages


@pytest.mark.parametrize("path", CATALOGS, ids=[i18n.docname(p) for p in CATALOGS])
def test_catalog_is_complete_and_sound(path: Path) -> None:
    """Every entry translated, none fuzzy, markup kept, numbered titles escaped, terms kept."""
    problems = i18n.catalog_problems(path)
    assert not problems, "\n".join(map(str, problems[:20])) + f"\n({len(problems)} in all)"


def test_catalogs_match_the_english_text(tmp_path: Path) -> None:
    """Extract the English text afresh: every message must be in the catalogs, and back.

    Fails after an English edit until `make catalogs` has run and the new entries are
    translated (then the test above checks them).
    """
    pot_dir = tmp_path / "gettext"
    i18n.extract(pot_dir, doctrees=tmp_path / "doctrees")
    problems = i18n.stale_problems(pot_dir)
    assert not problems, (
        "the catalogs are stale; run `make catalogs` and translate the new entries:\n"
        + "\n".join(map(str, problems[:20]))
    )


def test_code_and_outputs_are_not_in_the_catalogs() -> None:
    """Only prose is translated: no code cell and no printed output becomes a message."""
    import json

    code = set()
    for notebook in sorted((ROOT / "book").glob("*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] != "code":
                continue
            code.add("".join(cell["source"]).strip())
            for out in cell.get("outputs", []):
                code.add("".join(out.get("text", "")).strip())
    code.discard("")
    assert len(code) > 100  # the notebooks were read
    messages = {m.id.strip() for path in CATALOGS for m in i18n.messages(i18n.load(path))}
    assert not messages & code, sorted(messages & code)[:5]
    assert not [m for m in messages if m.startswith(("import ", "from ", "torch."))]


def test_catalogs_have_no_source_locations_or_obsolete_entries() -> None:
    for path in CATALOGS:
        text = path.read_text(encoding="utf-8")
        assert "\n#: " not in text, f"{path}: source locations make every edit churn"
        assert "\n#~ " not in text, f"{path}: obsolete entries left behind"


# The checks can fail -------------------------------------------------------------------


def test_a_bare_numbered_title_is_refused() -> None:
    assert any(
        "numbered title" in p for p in i18n.message_problems("3. Softmax", "3. Softmax 函数", False)
    )
    assert not i18n.message_problems("3. Softmax", "3\\. Softmax 函数", False)
    assert any(
        "numbered title" in p
        for p in i18n.message_problems("3. Softmax", "4\\. Softmax 函数", False)
    )


def test_untranslated_fuzzy_and_english_entries_are_refused() -> None:
    assert i18n.message_problems("Why not divide by the sum?", "", False) == ["untranslated"]
    assert any("fuzzy" in p for p in i18n.message_problems("Temperature", "温度", True))
    english = "Why not divide by the sum?"
    assert any("left in English" in p for p in i18n.message_problems(english, english, False))


def test_display_formulas_are_copied_unchanged() -> None:
    formula = "\n\\text{weights} = \\operatorname{softmax}(S) \\text{ kept}\n"
    assert not i18n.message_problems(formula, formula, False)
    assert i18n.message_problems(formula, formula.replace("S", "T"), False)


def test_lost_or_changed_markup_is_refused() -> None:
    msgid = "See [chapter 4](04_weighted_sum.ipynb): $QK^\\top$ with `dim=-1` {cite}`vaswani2017attention`."
    good = (
        "见[第 4 章](04_weighted_sum.ipynb)：$QK^\\top$ 与 `dim=-1` {cite}`vaswani2017attention`。"
    )
    assert not i18n.message_problems(msgid, good, False)
    for broken in (
        good.replace("04_weighted_sum", "05_masking"),
        good.replace("$QK^\\top$", "QK"),
        good.replace("`dim=-1`", "dim=-1"),
        good.replace("{cite}`vaswani2017attention`", ""),
    ):
        assert any("markup differs" in p for p in i18n.message_problems(msgid, broken, False)), (
            broken
        )
    # A glossary reference may show other text as long as it keeps its target.
    assert not i18n.message_problems("the {term}`query` of it", "它的 {term}`Query <query>`", False)


def test_transformer_is_never_translated() -> None:
    problems = i18n.message_problems("The Transformer encoder", "变压器编码器", False)
    assert len(problems) == 2


def test_the_exercises_sentence_has_one_translation() -> None:
    wrong = "请先做练习，再看答案；每个答案都能运行，并用 `assert` 检查自己。"
    assert i18n.message_problems(i18n.EXERCISES_EN, i18n.EXERCISES_ZH, False) == []
    assert any(
        "exercises sentence" in p for p in i18n.message_problems(i18n.EXERCISES_EN, wrong, False)
    )


def test_terms_the_style_guide_retires_are_refused() -> None:
    avoided = i18n.avoided_terms()
    assert avoided["旋转嵌入"].startswith("旋转位置编码") and "et al." in avoided
    msgid = "Xiao et al. rotate the keys with `rotary_emb`."
    problems = i18n.message_problems(msgid, "Xiao et al. 用旋转嵌入 `rotary_emb` 转动 Key。", False)
    assert sum("avoid" in p for p in problems) == 2, problems
    assert not i18n.message_problems(
        msgid, "Xiao 等人用旋转位置编码 `rotary_emb` 转动 Key。", False
    )
    # Inside code or maths the words are not prose: `et al.` in a code span is fine.
    assert not i18n.message_problems("`et al.` here", "这里的 `et al.`", False)
