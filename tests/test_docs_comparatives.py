"""A comparative word in a results sentence stands beside a paired interval that excludes 0, or the
sentence says "in direction": the house rule, held for README.md, docs/reproductions.md,
docs/benchmarks.md and docs/faults-and-audit.md.

**Prose.** A page's prose is what is left outside fenced and indented code blocks, table rows and
headings; inline code spans and link targets are masked (they hold names and paths, not claims).
Prose is cut into paragraphs and list items, and those into sentences at a ``.``, ``!`` or ``?``
followed by white space (``Fig.``, ``Eq.``, ``App.``, ``e.g.`` and the like end none).

**A results sentence** states a measured figure or points at measured rows, and is not a question:
it holds a digit outside code spans, link targets, citations and references (``Fig. 4``, ``Figure
3``, ``§6.2``, ``Eq. 10``, ``App. C.2``, ``Thm 5.1``, ``Prop. 3.2``, ``Table 1``), or it names
``these`` / ``those`` rounds, runs, regimes, seeds, tables, rows or results, or ``all three``
(a count) of them. Any other sentence describes behaviour or design.

**A comparative** is one of beat(s/ing/en), outperform(s/ed/ing), faster, slower, sooner, ``later
than``, above, below, higher, lower, better, worse, ahead, behind, and more / less / fewer /
greater / larger / smaller ``than``. These uses of them claim no ordering of two estimates and are
not checked:

- *a pointer within the page*: ``above`` / ``below`` at the end of a clause (``as said above.``,
  ``(below)``), after a word naming a part of the page (``the table above``, ``every row above``,
  ``the crafted runs above``: :data:`PAGE_PARTS`), or before a word that cannot begin the thing
  compared (``seeds 1-5 below are``: :data:`POINTER_NEXT`); not after a count (``5 of 5 below``);
- *a threshold or a fixed reference*: the comparative directly followed (through ``than``) by a
  number, ``zero``, ``chance``, a one-letter symbol (not the article ``a``), or ``the`` / ``a`` …
  ``median`` / ``threshold`` / ``timeout`` (``above 1.05 is marked``, ``files larger than 8 MiB``,
  ``an interval above 0``, ``below τ``, ``wages above the training median``, ``slower than the
  round's timeout``): a rule, a bound or a constant, not a second estimate;
- *a setting*: ``higher`` / ``lower`` before a setting's name (``a higher budget``:
  :data:`SETTINGS`);
- *negated or hypothetical*: ``no``, ``not``, ``none``, ``nothing``, ``never``, ``neither``,
  ``nor``, ``cannot``, or ``may``, ``might``, ``could``, ``would``, within the four words before it
  in its phrase (no comma, colon, semicolon, parenthesis or dash between: ``nothing beats random``,
  ``not clearly better than``, ``may be lower``), or its clause (between semicolons and dashes) says
  ``does not show`` / ``do not show``: the sentence claims no ordering;
- *quoted*: inside double quotes, a paper's claim or a rule's name, which the sentence then judges;
- *a definition*: a sentence ``A rule *beats random …* when …`` (the term in emphasis after ``A`` /
  ``An`` and a noun, then ``when`` or ``if``), or a clause that says ``higher is better``;
- *the allowlist* :data:`NOT_COMPARATIVE`, phrase by phrase, each with its reason.

**A comparative passes** when its clause holds (the part of its sentence between semicolons and dashes
at the comparative's own depth of parentheses, so one backed comparative does not carry another
clause's; its parentheses are part of it; a sentence that ends in ``:`` takes in the list items
right after it; a list item's bold lead-in, its verdict, heads each of its sentences):

- a paired interval that excludes its null, parsed and checked by number: a signed difference
  ``+0.014 [+0.008, +0.021]`` or ``−0.028 ± 0.015`` (both bounds of one sign); an unsigned interval
  followed by the comparative itself, ``12.0 [7.7, 16.3] rounds sooner`` (a difference's size, both
  bounds above 0); or a ratio, ``0.59 [0.50, 0.69] of random's``, in a sentence that says ``×``,
  ``of …'s``, ``ratio`` or ``gain`` (both bounds on one side of 1);
- or two levels side by side, ``A against B`` (at most three words between), each an interval or
  a single figure, at least one an interval, that do not overlap, also checked by number: ``0.663
  [0.620, 0.706] against 0.575 [0.537, 0.613]``, ``0.483 ± 0.025 against 0.412 ± 0.030``, ``0.777
  [0.765, 0.788] against 0.516`` (the majority class). This is the house's "intervals apart": two
  95% intervals over the same seeds that do not overlap imply a paired one that excludes 0;
- or the words ``in direction`` (the house phrase for a difference whose interval includes 0 or
  that has none);
- or, on docs/benchmarks.md only, the figures compared side by side (``43 against 30 ms``, ``3.0 s
  instead of 4.5 s``, ``1.41 (was 1.61)``): that page measures one machine's costs, not estimates
  over seeds, and its convention (its first paragraph) is medians or ratios measured side by side
  in one run, which the sentence then quotes.

An unsigned interval anywhere else is a level (an accuracy with its interval) and on its own is no
evidence of an ordering. A bound written ``−0.000`` is a negative number rounded (``[−0.003,
−0.000]`` excludes 0), one written ``+0.000`` or ``0.000`` may be 0 (``[−0.011, +0.000]`` does not).
The evidence is looked for in the whole sentence, not beside each word: a sentence that orders two
things and backs one of them passes. A failure names the page, the line of the comparative and the
sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs/reproductions.md", "docs/benchmarks.md", "docs/faults-and-audit.md")
SIDE_BY_SIDE_PAGES = ("docs/benchmarks.md",)

NUMBER = r"[+\-−]?\d+(?:\.\d+)?"
INTERVAL = re.compile(rf"(?:({NUMBER})\s*)?\[\s*({NUMBER})\s*,\s*({NUMBER})\s*\]")
PLUS_MINUS = re.compile(r"(?<![\w.])([+\-−]?)(\d+(?:\.\d+)?)\s*±\s*(\d+(?:\.\d+)?)")
RATIO_CUE = re.compile(r"×|\bof [\w-]+(?:'s|’s)|\bratio|\bgain", re.IGNORECASE)
SIDE_BY_SIDE = re.compile(r"\d\S*\s*(?:[a-zA-Z%×]+\s+)?(?:against|instead of)\s+(?:[\w'’]+\s+){0,3}?[+\-−]?\d"
                          r"|\d\s*\(was\s+\d|\bfrom\s+\d\S*\s+to\s+\d")
IN_DIRECTION = re.compile(r"\bin direction\b", re.IGNORECASE)

COMPARATIVE = re.compile(
    r"\b(beat(?:s|ing|en)?|outperform(?:s|ed|ing)?|faster|slower|sooner|later\s+than|above|below|higher|lower"
    r"|better|worse|ahead|behind|(?:more|less|fewer|greater|larger|smaller)\*?(?:\s+[\w-]+){0,2}?\s+than)\b",
    re.IGNORECASE)
#: Nouns for parts of a page (or of the runs it reports) that ``above`` / ``below`` point to.
PAGE_PARTS = {"table", "tables", "row", "rows", "column", "columns", "section", "figure", "figures", "line",
              "list", "paragraph", "excerpt", "example", "definition", "study", "test", "run", "runs", "set"}
#: Words that cannot begin the thing an ``above`` / ``below`` compares with.
POINTER_NEXT = {"for", "on", "in", "is", "are", "was", "were", "does", "do", "did", "fails", "audits", "searches",
                "test", "tests", "this", "these", "as", "when", "where", "which", "who", "up", "through"}
CONSTANT = re.compile(r"\s*(?:than\s+)?(?:[+\-−]?\d|(?:zero|chance)\b"
                      r"|(?:[α-ωΑ-Ω]|(?![aAI]\b)[a-zA-Z])(?:_\w+)?(?![\w'’-])"
                      r"|(?:the|a)\s+(?:[\w'’-]+\s+){0,3}?(?:median|threshold|timeout)\b)")
#: Names of settings a ``higher`` / ``lower`` may qualify.
SETTINGS = {"budget", "budgets", "learning", "rate", "damping", "temperature"}
NEGATION = re.compile(r"\b(?:no|not|none|nothing|never|neither|nor|cannot|may|might|could|would)\b", re.IGNORECASE)
DENIED = re.compile(r"\b(?:does|do)\s+not\s+show\b", re.IGNORECASE)
CONVENTION = re.compile(r"\b(?:higher|lower)\s+is\s+(?:better|worse)\b", re.IGNORECASE)
DEFINITION = re.compile(r"^An?\s+[\w-]+\s+\*[^*]+\*\s+(?:when|if)\b")
#: Phrases whose comparative compares nothing measured, each with its reason.
NOT_COMPARATIVE = {
    "queued behind": "a place in the actors' queue (the slow-client fault), not a ranking",
    "k larger than the clients per round": "an option the command line refuses (a validation rule)",
}

REFERENCE = re.compile(r"(?:\b(?:Figs?|Figures?|Eqs?|App|Thm|Alg|Prop|Remark|Table|Section|Sec)\.?|§)\s*"
                       r"[A-Z]?\d+(?:\.\d+)*(?:\([a-z]\))?")
MEASURED_ROWS = re.compile(r"\b(?:these|those|all\s+(?:two|three|four|five|six|seven|eight|nine|ten))\s+"
                           r"(?:rounds|runs|regimes|seeds|tables|rows|results)\b", re.IGNORECASE)
CITATION = re.compile(r"\[[A-Z][A-Z0-9-]+\]")
CODE_SPAN = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
LEVEL = rf"{NUMBER}\s*\[\s*{NUMBER}\s*,\s*{NUMBER}\s*\]|{NUMBER}\s*±\s*\d+(?:\.\d+)?|{NUMBER}"
#: Two levels side by side, each an interval or a single figure: "0.663 [0.620, 0.706] against 0.575".
LEVELS_AGAINST = re.compile(rf"(?<![\w.])({LEVEL})\)?\s+against\s+(?:[\w'’]+\s+){{0,3}}?({LEVEL})")
LEAD_IN = re.compile(r"^\s*(?:[-*+]|\d+\.)\s+\*\*[^*]+\*\*")
ABBREVIATIONS = ("Fig", "Figs", "Eq", "Eqs", "App", "Alg", "Thm", "Prop", "Sec", "vs", "e.g", "i.e", "al", "cf", "No",
                 ".")
SENTENCE_END = re.compile("".join(rf"(?<!\b{re.escape(a)})" if a[0].isalpha() else rf"(?<!{re.escape(a)})"
                                  for a in ABBREVIATIONS) + r"[.!?][)*\"”’]*(?=\s)")


@dataclass
class Block:
    """A paragraph or a list item: its text as written, the same text masked (one line, code spans
    and link targets blanked, every offset kept), each character's line number, and whether it is a
    list item."""

    text: str
    masked: str
    lines: list[int]
    is_item: bool


@dataclass
class Sentence:
    block: int
    text: str
    masked: str
    lines: list[int]


def _mask(text: str) -> str:
    text = CODE_SPAN.sub(lambda m: "`" + "_" * (len(m.group()) - 2) + "`", text.replace("\n", " "))
    return LINK_TARGET.sub(lambda m: "]" + " " * (len(m.group()) - 1), text)


def blocks(page: str, text: str | None = None) -> list[Block]:
    """The prose of a page as paragraphs and list items, with fenced and indented code, table rows
    and headings left out."""
    found: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] | None = None
    fenced, after_blank = False, True
    for number, line in enumerate((text if text is not None else (ROOT / page).read_text()).splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced, current = not fenced, None
            continue
        if fenced or stripped.startswith(("|", "#")):
            current, after_blank = None, False
            continue
        if not stripped:
            current, after_blank = None, True
            continue
        if line.startswith("    ") and after_blank and current is None:
            after_blank = False  # an indented code block
            continue
        after_blank = False
        if current is None or LIST_ITEM.match(line):
            current = []
            found.append(current)
        current.append((number, line))
    out = []
    for lines in found:
        text_ = "\n".join(line for _, line in lines)
        numbers = [n for n, line in lines for _ in range(len(line) + 1)]
        out.append(Block(text_, _mask(text_), numbers, bool(LIST_ITEM.match(lines[0][1]))))
    return out


def sentences(page_blocks: list[Block]) -> list[Sentence]:
    out = []
    for index, block in enumerate(page_blocks):
        starts = [0, *(m.end() for m in SENTENCE_END.finditer(block.masked))]
        for start, end in zip(starts, [*starts[1:], len(block.masked)]):
            start += len(block.masked[start:end]) - len(block.masked[start:end].lstrip())
            if block.masked[start:end].strip():
                out.append(Sentence(index, block.text[start:end].rstrip(), block.masked[start:end].rstrip(),
                                    block.lines[start:end]))
    return out


def is_results_sentence(sentence: Sentence) -> bool:
    unreferenced = CITATION.sub(" ", REFERENCE.sub(" ", sentence.masked))
    figures = bool(re.search(r"\d", unreferenced) or MEASURED_ROWS.search(sentence.masked))
    return figures and not sentence.masked.rstrip("*)").endswith("?")


def _clause(masked: str, at: int) -> tuple[int, int]:
    """The clause around offset ``at``: between semicolons and dashes at its own depth of parentheses (a
    parenthesis's semicolons part its items, not the sentence's clauses)."""
    depth, depths = 0, []
    for char in masked:
        depth += char == "("
        depths.append(depth)
        depth -= char == ")" and depth > 0
    own = depths[at] if at < len(masked) else 0
    cuts = [i for i, char in enumerate(masked) if depths[i] == own and (char == ";" or masked.startswith(" — ", i))]
    start = max((i for i in cuts if i < at), default=-1) + 1
    return start, min((i for i in cuts if i >= at), default=len(masked))


def _quoted(masked: str, at: int) -> bool:
    before = masked[:at]
    return before.count('"') % 2 == 1 or before.count("“") > before.count("”")


def _is_pointer(masked: str, at: int, end: int) -> bool:
    if re.search(r"\d+ of \d+\s*$", masked[:at]):
        return False  # "(5 of 5 below)": a count of seeds, the thing compared left understood
    previous = re.findall(r"[\w'’-]+", masked[:at])
    following = re.match(r"[\"”’*]*\s*([\w'’+−-]+)?", masked[end:])
    next_word = following.group(1) if following else None
    return (next_word is None or bool(re.match(r"[\"”’*]*\s*[,.;:)]", masked[end:]))
            or next_word.lower() in POINTER_NEXT or bool(previous and previous[-1].lower() in PAGE_PARTS))


def claims_an_ordering(masked: str, match: re.Match) -> bool:
    """Whether the comparative ``match`` in a sentence's masked text orders two estimates (the uses
    the module docstring lists do not)."""
    word, at, end = " ".join(match.group(1).lower().split()), match.start(), match.end()
    clause_start, clause_end = _clause(masked, at)
    clause = masked[clause_start:clause_end]
    if word in ("above", "below") and _is_pointer(masked, at, end):
        return False
    placed = word in ("above", "below", "higher", "lower") or re.match(r"\s+than\b", masked[end:])
    if (placed or word.endswith("than")) and CONSTANT.match(masked[end:]):
        return False
    next_word = re.match(r"\s*([\w-]+)", masked[end:])
    if word in ("higher", "lower") and next_word and next_word.group(1).lower() in SETTINGS:
        return False
    leading = re.split(r"[,:;()—]", masked[clause_start:at])[-1]
    if NEGATION.search(" ".join(leading.split()[-4:])) or DENIED.search(clause):
        return False
    if _quoted(masked, at) or CONVENTION.search(clause) or DEFINITION.match(masked):
        return False
    window = " ".join(masked[max(0, at - 40):end + 40].lower().split())
    return not any(phrase in window and word in phrase for phrase in NOT_COMPARATIVE)


def _value(number: str) -> float:
    """A written figure's value; a negative one rounded to zero (``−0.000``) stays below 0."""
    value = float(number.replace("−", "-"))
    return -1e-12 if value == 0 and number[0] in "-−" else value


def _excludes(low: float, high: float, null: float) -> bool:
    return (low - null) * (high - null) > 0


def _level(written: str) -> tuple[float, float]:
    """A level as (low, high): its interval, or a single figure as a point."""
    numbers = [_value(n) for n in re.findall(NUMBER, written)]
    if "[" in written:
        return numbers[1], numbers[2]
    if "±" in written:
        return numbers[0] - abs(numbers[1]), numbers[0] + abs(numbers[1])
    return numbers[0], numbers[0]


def evidence(text: str, comparative: str) -> list[str]:
    """The intervals in ``text`` that back an ordering: paired ones that exclude their null (0 for a
    difference, 1 for a ratio), and levels side by side (``A against B``), at least one an interval,
    that do not overlap."""
    found = []
    ratio_sentence = bool(RATIO_CUE.search(text))
    for m in INTERVAL.finditer(text):
        centre, low, high = m.groups()
        after = text[m.end():m.end() + 40]
        if any(n and n[0] in "+-−" for n in (centre, low, high)) or re.match(
                rf"\s*(?:[\w-]+\s+){{0,2}}{re.escape(comparative)}\b", after, re.IGNORECASE):
            null = 0.0
        elif ratio_sentence:
            null = 1.0
        else:
            continue  # a level with its interval, evidence only beside another level (below)
        if _excludes(_value(low), _value(high), null):
            found.append(m.group())
    for m in PLUS_MINUS.finditer(text):
        centre, half = _value(m.group(1) + m.group(2)), _value(m.group(3))
        if m.group(1) and _excludes(centre - half, centre + half, 0.0):
            found.append(m.group())
    for m in LEVELS_AGAINST.finditer(text):
        (low_a, high_a), (low_b, high_b) = _level(m.group(1)), _level(m.group(2))
        if (low_a < high_a or low_b < high_b) and (high_a < low_b or high_b < low_a):
            found.append(m.group())
    return found


def _evidence_text(sentence: Sentence, page_blocks: list[Block], clause: tuple[int, int] | None = None) -> str:
    """A sentence's masked text, or the ``clause`` of it (start, end) a comparative stands in, with its list item's
    bold lead-in and, when the sentence ends in ``:``, the list items right after it."""
    block = page_blocks[sentence.block]
    lead = LEAD_IN.match(block.masked)
    own = sentence.masked if clause is None else sentence.masked[clause[0]:clause[1]]
    text = (lead.group() + " " if block.is_item and lead else "") + own
    if sentence.masked.rstrip("*").endswith(":"):
        for following in page_blocks[sentence.block + 1:]:
            if not following.is_item:
                break
            text += " " + following.masked
    return text


def check(page: str, text: str | None = None) -> tuple[int, list[str]]:
    """The number of results sentences of ``page`` that hold a comparative, and the failures among
    them, each naming the page, the comparative's line and the sentence."""
    page_blocks = blocks(page, text)
    checked, failures = 0, []
    for sentence in sentences(page_blocks):
        if not is_results_sentence(sentence):
            continue
        claims = [m for m in COMPARATIVE.finditer(sentence.masked) if claims_an_ordering(sentence.masked, m)]
        if not claims:
            continue
        checked += 1
        if page in SIDE_BY_SIDE_PAGES and SIDE_BY_SIDE.search(_evidence_text(sentence, page_blocks)):
            continue
        for claim in claims:  # each comparative is backed within its own clause (semicolons and dashes part them)
            backing = _evidence_text(sentence, page_blocks, _clause(sentence.masked, claim.start()))
            if not IN_DIRECTION.search(backing) and not evidence(backing, claim.group(1)):
                failures.append(f"{page}:{sentence.lines[claim.start()]}: {claim.group(1)!r} beside no paired "
                                f"interval excluding 0 and no 'in direction': {' '.join(sentence.text.split())}")
                break
    return checked, failures


@pytest.mark.parametrize("page", PAGES)
def test_every_comparative_in_a_results_sentence_has_its_interval_or_says_in_direction(page):
    checked, failures = check(page)
    assert not failures, f"{page}: {len(failures)} of {checked} comparative sentences fail:\n" + "\n".join(failures)


def test_the_pages_are_read():
    """The parser still finds the pages' results sentences and their comparatives (a page whose
    prose it no longer reads would pass vacuously)."""
    counts = {page: check(page)[0] for page in PAGES}
    assert sum(counts.values()) >= 50 and all(counts[page] for page in PAGES[1:]), counts


PASSING = [
    "With no bad client it ends +0.014 [+0.008, +0.021] above random.",
    "It reaches 95% 12.0 [7.7, 16.3] rounds sooner than random, in 0.59 [0.50, 0.69] of random's wall-clock.",
    "value-ucb ends below random (−0.028 ± 0.015).",
    "The gradient edit is ahead of I-JACK at DP ≤ 0.10 (−0.002 [−0.003, −0.000]).",
    "ADS is above LOO in direction only (0.899 ± 0.006 against 0.886 ± 0.009).",
    "ADS is above LOO (0.663 [0.620, 0.706] against 0.575 [0.537, 0.613]).",
    "Both models beat the majority class (0.777 [0.765, 0.788] against 0.516).",
    "Every row above runs the paper's protocol of 100 splits, as the table below does for 5.",
    "A gain above 1.05 is marked, files larger than 8 MiB stream, and Krum ends at 0.008, below chance.",
    "No value-driven policy beats the oracle in 5 seeds, and value-ucb is not clearly better than GreedyFed.",
    "At n = 16 the true fraction may be lower, against a reference at a higher budget of 320.",
    'The workshop version\'s "Marginal below TracIn" holds on 2 data sets.',
    "A rule *beats random drops at equal accuracy cost* when its gap is below random's by 0.",
    "Both beat the majority class (at round 1 0.776; over the last rounds 0.777 [0.765, 0.788] against 0.516).",
    "It ends +0.014 [+0.008, +0.021] above random; top-k ends below it in direction only (0.756 against 0.769).",
]
FAILING = [
    "With no bad client it ends +0.014 [−0.008, +0.021] above random.",
    "With no bad client it ends +0.014 above random.",
    "At DP ≤ 0.10 SIM-JACK is ahead by +0.006 [+0.000, +0.012].",
    "It reaches 95% 12.0 [0.0, 16.3] rounds sooner, in 0.59 [0.50, 1.69] of random's wall-clock.",
    "value-ucb ends below random (−0.028 ± 0.030).",
    "ADS is above LOO (0.899 ± 0.006 against 0.886 ± 0.009).",
    "ADS is above LOO (0.663 [0.600, 0.706] against 0.575 [0.537, 0.613]).",
    "ADS is above LOO (0.663 [0.620, 0.706], where LOO has 0.575 [0.537, 0.613]).",
    "GreedyFed is 2 rounds slower than value-ucb in every seed.",
    "So on these rounds the fixed-weight rule finds the bad clients better.",
    "It ends +0.014 [+0.008, +0.021] above random; top-k ends below it (0.756 against 0.769).",
    "ADS is above random in direction only — and above LOO (0.899 ± 0.006 against 0.886 ± 0.009).",
]


@pytest.mark.parametrize("sentence", PASSING)
def test_a_sentence_the_rule_accepts(sentence):
    assert check("example.md", sentence)[1] == []


@pytest.mark.parametrize("sentence", FAILING)
def test_a_sentence_the_rule_refuses_is_named_with_its_line(sentence):
    checked, failures = check("example.md", "Some prose.\n\n" + sentence)
    assert checked == 1 and len(failures) == 1 and failures[0].startswith("example.md:3: ")
    assert " ".join(sentence.split()) in failures[0]
