"""The independent leakage checker: EXTRACTION.md's exclusions, tested against the trajectory.

The checker is the authority, not the prompt. It looks at the text alone plus
what the trajectory contains, and reports each problem as a ``Violation`` with a
code a person can grep for:

=================== ==========================================================
code                what matched
=================== ==========================================================
item_id             an item id of the trajectory
identifier          a user/session id, or any SKU-like token (letters + digits)
title               a whole item title
title_fragment      a distinctive piece of a title (a brand-position word, a
                    model code, a word pair with a distinctive word, 4 title
                    words in a row, 4 CJK characters in a row)
future_item         any of the above for an item not seen yet (rationales)
price               a number equal to a price in the trajectory (129, 129.00,
                    ¥129, 129 yuan, 1,299)
currency_amount     any amount of money, even one not in the trajectory
action_word         an action in any inflection (clicked, scrolling, carts, added it to
                    my cart, add-to-cart, wishlisted ...)
outcome_word        an outcome in any inflection (bought, purchased, ended, checks out,
                    checked-out, check-out ...)
step_reference      "at step 5", "the second session", "at the end of the visit"
position_reference  "the third item", "card #4", "item 2"
=================== ==========================================================

Rationales are checked by ``check_rationale``: besides ids, unseen items and step
references, ``contradictions`` catches a first-person claim of another action than the
recorded one, about now ("I'll buy it") or done ("I added it to cart." on a scroll).

``find_leaks`` is the public entry point; ``LeakIndex`` precomputes the title,
id and price lookups of one trajectory so that many texts are checked cheaply.
Titles count as *distinctive* when they carry a word outside the generic shopping
vocabulary below (extended by the caller with the catalog's category names and
parameter values): "prefers relaxed linen" is clean, "Lumora Slim" is not.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import cached_property, lru_cache
from typing import NamedTuple

LEAK_CODES: tuple[str, ...] = (
    "item_id",
    "identifier",
    "title",
    "title_fragment",
    "future_item",
    "price",
    "currency_amount",
    "action_word",
    "outcome_word",
    "step_reference",
    "position_reference",
)
#: one line per code, shown to the model when it is re-asked
EXPLAIN: dict[str, str] = {
    "item_id": "an item identifier",
    "identifier": "an identifier or SKU-like code",
    "title": "a product title",
    "title_fragment": "a distinctive piece of a product title (brand, model or wording)",
    "future_item": "an item that is not visible yet",
    "price": "an exact price from the log",
    "currency_amount": "an amount of money",
    "action_word": "a concrete app action",
    "outcome_word": "a concrete outcome",
    "step_reference": "a step, session or moment in the log",
    "position_reference": "a position in the feed",
    "empty": "an empty answer",
    "too_long": "too many words",
    "contradicts_action": "a statement that contradicts the recorded action",
    "invalid_json": "not valid JSON",
    "schema_mismatch": "JSON of the wrong shape",
}


@dataclass(frozen=True)
class Violation:
    code: str
    match: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.code}: {self.match!r} ({EXPLAIN.get(self.code, self.code)})"


# --- normalisation and tokens ------------------------------------------------------------

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[a-z0-9]+|[{_CJK}]")
_POSSESSIVE = re.compile(r"'s\b")


def normalize(text: str) -> str:
    """NFKC, lower case, one apostrophe; possessive 's blanked (same length, so spans stay valid)."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    return _POSSESSIVE.sub("  ", text)


@lru_cache(maxsize=1 << 16)
def stem(token: str) -> str:
    """Crude singular, applied to both sides alike ("dresses" and "dress" meet)."""
    if len(token) <= 3 or not token.isalpha():
        return token
    if token.endswith("ies"):
        return token[:-3] + "y"
    if token.endswith(("sses", "shes", "ches", "xes")):
        return token[:-2]
    if token.endswith("s") and not token.endswith("ss"):
        return token[:-1]
    return token


class Token(NamedTuple):
    text: str  # stemmed
    start: int
    end: int


def tokens(normalized: str) -> list[Token]:
    return [Token(stem(m.group()), m.start(), m.end()) for m in _TOKEN.finditer(normalized)]


def _words(text: str) -> frozenset[str]:
    return frozenset(stem(w) for w in text.split())


STOPWORDS = _words(
    """a an the and or of for with in on at to from by as is are was were be been it its this that these
    those her his their she he they them who whom which what when than then so such very more most less
    least much many few not no nor but if into over under about after before while same other each any all
    both only own just also too can will would should could may might up down out off again once here
    there where why how our your my me we you i s t per via"""
)
GENERIC_WORDS = _words(
    """black white grey gray navy blue red green pink beige brown cream ivory khaki olive burgundy maroon
    purple lilac lavender yellow orange gold golden silver rose nude tan camel charcoal mint teal coral sage
    sky pastel neutral muted bright dark light colour color colourful colorful print printed floral striped
    stripe plaid checked solid pattern patterned tone tones shade shades
    cotton linen silk wool cashmere denim leather suede satin velvet knit knitted polyester nylon spandex
    lycra chiffon lace mesh fleece corduroy canvas bamboo ceramic glass steel stainless metal wood wooden
    oak plastic rubber titanium aluminium aluminum carbon pearl crystal sterling plated vegan acetate
    polycarbonate rattan marble natural organic synthetic fabric material blend graphite matte
    slim fit loose regular relaxed oversized tailored cropped high waist waisted low mid rise straight
    wide leg skinny flared fitted stretchy stretch soft lightweight heavy thick thin warm cool breathable
    comfortable comfy cosy cozy casual formal elegant classic vintage retro modern minimalist minimal
    simple chic boho bohemian street sporty sport athletic outdoor everyday daily basic essential statement
    trendy fashionable stylish cute sweet smart business office work party travel beach summer winter
    spring autumn fall season seasonal new latest premium luxury affordable cheap budget value quality
    durable sturdy handmade adjustable portable compact wireless waterproof foldable stackable noise
    cancelling canceling fast charging ergonomic rustic nordic scandi dainty layered personalised
    personalized hypoallergenic deluxe family size easy care long lasting gift ready unscented assorted
    original plain pro ultra mini maxi midi short long big small large medium extra
    dress skirt top tee shirt blouse sweater cardigan hoodie jacket coat jean trouser pant short legging
    suit vest knitwear outerwear underwear bra sock shoe sneaker boot sandal heel flat loafer bag handbag
    tote backpack wallet purse clutch necklace earring ring bracelet watch jewellery jewelry accessory hat
    cap scarf belt glasses sunglasses phone case charger cable headphone earbud speaker laptop keyboard
    mouse monitor lamp cushion throw curtain vase candle mug plate pan pot knife toy doll puzzle book pen
    notebook item product piece set pack kit women woman womens men man mens kid children child girl boy
    baby unisex ladies lady home kitchen decor beauty skincare makeup
    price priced pricing brand review rating photo picture image detail description specification spec
    option alternative choice style look design feature deal discount sale offer shipping delivery
    pc pcs cm mm ml kg"""
)

_ALNUM_CODE = re.compile(r"^(?=.*\d)(?=.*[a-z])[a-z0-9]+$")
_UNIT_LIKE = re.compile(
    r"^\d+(?:k|g|gb|tb|mb|mah|w|v|hz|mm|cm|m|ml|l|kg|pcs|pc|p|x|d|s|st|nd|rd|th|h|in|oz|lb|ft)$"
)


def is_model_code(token: str) -> bool:
    """Letters mixed with digits ("x200", "a7iii"), not a unit or an ordinal ("4k", "128gb", "2nd")."""
    return len(token) >= 3 and bool(_ALNUM_CODE.match(token)) and not _UNIT_LIKE.match(token)


@lru_cache(maxsize=64)
def generic_vocabulary(terms: frozenset[str]) -> frozenset[str]:
    """The built-in generic words plus the caller's terms (category names, parameter values), tokenized."""
    return GENERIC_WORDS | {t.text for term in terms for t in tokens(normalize(term))}


@lru_cache(maxsize=1 << 18)
def title_tokens(title: str) -> tuple[str, ...]:
    """A title's stemmed tokens (titles recur across trajectories: tokenized once)."""
    return tuple(t.text for t in tokens(normalize(title)))


def _distinctive(token: str, generic: frozenset[str]) -> bool:
    return (
        len(token) >= 3
        and not token.isdigit()
        and token not in STOPWORDS
        and token not in generic
        and token.isascii()
    )


@lru_cache(maxsize=1 << 18)
def title_fragments(toks: tuple[str, ...], generic: frozenset[str]) -> tuple[tuple[str, ...], ...]:
    """The distinctive pieces of one title (see the module docstring)."""
    found: list[tuple[str, ...]] = []
    first = toks[0]
    if _distinctive(first, generic) and first.isalpha() and len(first) >= 4:
        found.append((first,))  # the brand position
    for i, tok in enumerate(toks):
        if is_model_code(tok):
            found.append((tok,))
        pair = toks[i : i + 2]
        if len(pair) == 2 and _latin_content(pair) and any(_distinctive(t, generic) for t in pair):
            found.append(pair)
        quad = toks[i : i + 4]
        if len(quad) == 4 and all(t.isascii() for t in quad) and sum(t not in STOPWORDS for t in quad) >= 3:
            found.append(quad)
        if len(quad) == 4 and not any(t.isascii() for t in quad):
            found.append(quad)  # four CJK characters in a row
    return tuple(found)


# --- the per-trajectory index --------------------------------------------------------------


@dataclass(frozen=True)
class IndexEntry:
    """One thing the trajectory contains; ``owner`` says whose it is (an item id, "seen", "future")."""

    owner: str
    item_id: str | None = None
    title: str | None = None
    price: float | None = None


@dataclass(frozen=True)
class Hit:
    code: str
    match: str
    start: int
    end: int
    owners: frozenset[str] = frozenset()


def price_key(value: float | str | Decimal) -> Decimal | None:
    """Cents-exact key: 129, 129.0, "129.00" and "1,299" compare as prices do."""
    try:
        return Decimal(str(value).replace(",", "")).quantize(Decimal("0.01"))
    except (InvalidOperation, ValueError):
        return None


@dataclass
class LeakIndex:
    """Title fragments, ids and prices of one trajectory, mapped to their owners."""

    generic: frozenset[str] = GENERIC_WORDS
    ids: dict[str, set[str]] = field(default_factory=dict)
    identifiers: set[str] = field(default_factory=set)
    titles: dict[int, dict[tuple[str, ...], set[str]]] = field(default_factory=dict)  # by length
    fragments: dict[tuple[str, ...], set[str]] = field(default_factory=dict)
    prices: dict[Decimal, set[str]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        entries: Iterable[IndexEntry],
        *,
        identifiers: Iterable[str] = (),
        generic_terms: Iterable[str] = (),
    ) -> LeakIndex:
        index = cls(generic=generic_vocabulary(frozenset(generic_terms)))
        index.identifiers = {i.lower() for i in identifiers if i}
        for entry in entries:
            index.add(entry)
        return index

    def add(self, entry: IndexEntry) -> None:
        self.__dict__.pop("_id_words", None)  # rebuilt on the next scan
        if entry.item_id:
            self.ids.setdefault(entry.item_id.lower(), set()).add(entry.owner)
        if entry.price is not None and (key := price_key(entry.price)) is not None:
            self.prices.setdefault(key, set()).add(entry.owner)
        if entry.title:
            self._add_title(title_tokens(entry.title), entry.owner)

    def _add_title(self, toks: tuple[str, ...], owner: str) -> None:
        if not toks:
            return
        if len(toks) > 1 or _distinctive(toks[0], self.generic):
            self.titles.setdefault(len(toks), {}).setdefault(toks, set()).add(owner)
        for gram in title_fragments(toks, self.generic):
            self.fragments.setdefault(gram, set()).add(owner)

    # --- scanning ------------------------------------------------------------------------

    def scan(self, normalized: str) -> list[Hit]:
        """Title, fragment, id and price hits in an already ``normalize``d text."""
        toks = tokens(normalized)
        hits = self._title_hits(normalized, toks) + self._id_hits(normalized)
        return hits + price_hits(normalized, self.prices)

    def _title_hits(self, text: str, toks: list[Token]) -> list[Hit]:
        words = [t.text for t in toks]
        found: list[Hit] = []
        for size, table in self.titles.items():
            found += _gram_hits(text, toks, words, size, table, "title")
        for size in (1, 2, 4):
            found += _gram_hits(text, toks, words, size, self.fragments, "title_fragment")
        return _drop_nested(found)

    @cached_property
    def _id_words(self) -> tuple[frozenset[str], list[str]]:
        """Ids made of id characters only (found by a set lookup per word), and the odd others."""
        every = set(self.ids) | self.identifiers
        plain = frozenset(i for i in every if _ID_WORD.fullmatch(i))
        return plain, sorted(every - plain)

    def _id_hits(self, text: str) -> list[Hit]:
        plain, odd = self._id_words
        spans = [m.span() for m in _ID_WORD.finditer(text) if m.group() in plain]
        spans += [span for ident in odd for span in _exact(text, ident)]
        return [self._id_hit(text, s, e) for s, e in spans]

    def _id_hit(self, text: str, start: int, end: int) -> Hit:
        owners = self.ids.get(text[start:end])
        code = "item_id" if owners is not None else "identifier"
        return Hit(code, text[start:end], start, end, frozenset(owners or ()))


def _latin_content(pair: tuple[str, ...]) -> bool:
    return all(t.isascii() and t not in STOPWORDS for t in pair)


def _gram_hits(
    text: str,
    toks: list[Token],
    words: list[str],
    size: int,
    table: dict[tuple[str, ...], set[str]],
    code: str,
) -> list[Hit]:
    hits = []
    for i in range(len(words) - size + 1):
        owners = table.get(tuple(words[i : i + size]))
        if owners:
            start, end = toks[i].start, toks[i + size - 1].end
            hits.append(Hit(code, text[start:end], start, end, frozenset(owners)))
    return hits


def _drop_nested(hits: list[Hit]) -> list[Hit]:
    """A whole title also matches its fragments: keep the outermost span only."""
    kept: list[Hit] = []
    for hit in sorted(hits, key=lambda h: (h.start, -h.end)):
        if not any(k.start <= hit.start and hit.end <= k.end for k in kept):
            kept.append(hit)
    return kept


_ID_WORD = re.compile(r"[a-z0-9_]+")


def _exact(text: str, needle: str) -> Iterable[tuple[int, int]]:
    """Occurrences of ``needle`` not glued to other id characters."""
    start = text.find(needle)
    while start >= 0:
        end = start + len(needle)
        glued = (start and _ID_WORD.match(text[start - 1])) or (end < len(text) and _ID_WORD.match(text[end]))
        if not glued:
            yield start, end
        start = text.find(needle, start + 1)


# --- prices and money ----------------------------------------------------------------------

_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_CURRENCY = re.compile(
    rf"(?:[¥$€£]|\b(?:rmb|cny|usd|eur|us\$)\s?)\s?(?P<a>{_NUM})"
    rf"|(?<![a-z0-9_.,])(?P<b>{_NUM})\s?(?:(?:yuan|rmb|cny|usd|dollars?|bucks|euros?|eur)\b|元|块|円)"
)
_BARE = re.compile(rf"(?<![a-z0-9_.,$¥€£])(?:{_NUM})(?![a-z0-9_%]|[.,]\d)")


def price_hits(text: str, prices: dict[Decimal, set[str]]) -> list[Hit]:
    """Currency amounts (any) and bare numbers equal to a trajectory price."""
    hits: list[Hit] = []
    taken: list[tuple[int, int]] = []
    for m in _CURRENCY.finditer(text):
        value = price_key(m.group("a") or m.group("b"))
        owners = prices.get(value, set()) if value is not None else set()
        hits.append(
            Hit("price" if owners else "currency_amount", m.group(), m.start(), m.end(), frozenset(owners))
        )
        taken.append(m.span())
    for m in _BARE.finditer(text):
        if any(s <= m.start() < e for s, e in taken):
            continue
        value = price_key(m.group())
        if value is not None and value in prices:
            hits.append(Hit("price", m.group(), m.start(), m.end(), frozenset(prices[value])))
    return hits


# --- words: actions, outcomes, steps, positions, SKU-like tokens -----------------------------

_ORD = r"(?:\d+(?:st|nd|rd|th)|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)"
_POSS = r"(?:the\s+|a\s+|an\s+|her\s+|his\s+|their\s+|my\s+|each\s+)?"
_PUT_VERBS = (
    "add|adds|added|adding|put|puts|putting|save|saves|saved|saving|place|places|placed|placing"
    "|drop|drops|dropped|dropping|toss|tosses|tossed|tossing|pop|pops|popped|popping|throw|throws|threw"
    "|throwing|stick|sticks|stuck|sticking"
)
_CART_WORDS = r"cart|carts|trolley|basket|bag|wish\s?list|favou?rites"
_CHECK_OUT = r"\bcheck(?:s|ed|ing)?(?:\s+(?:it|them|this|that|these|those))?[\s_-]*outs?\b"
_LEXICON: tuple[tuple[str, str], ...] = (
    ("action_word", r"\bclick(?:s|ed|ing)?\b|\btap(?:s|ped|ping)?\b|\bscroll(?:s|ed|ing)?\b"),
    ("action_word", r"\bswip(?:e|es|ed|ing)\b|\bcart(?:s|ed|ing)?\b|\b(?:opened|viewed|browsed|revisited)\b"),
    (
        "action_word",
        rf"\b(?:{_PUT_VERBS})\b(?:[\s_-]+\S+){{0,3}}?[\s_-]+(?:to|in|into|2)[\s_-]+"
        rf"{_POSS}(?:shopping[\s_-]+)?(?:{_CART_WORDS})\b",
    ),
    (
        "action_word",
        rf"\badd(?:s|ed|ing)?[\s_-]*(?:to|2)[\s_-]*(?:{_CART_WORDS})\b"
        r"|\bwish[\s-]?list(?:s|ed|ing)\b|\bfavou?rit(?:ed|ing)\b",
    ),
    ("action_word", r"\bexit(?:s|ed|ing)?\b|\bquit(?:s|ting)?\b|\bback[\s_-]?home\b"),
    (
        "action_word",
        r"\b(?:go|goes|going|gone|went|head|heads|headed|heading|navigat\w*|came|come|comes|coming)\s+back\b",
    ),
    (
        "action_word",
        r"\b(?:leave|leaves|leaving|left)\s+(?:the\s+)?(?:page|app|feed|session|site|store|shop|listing)\b"
        r"|\breturn(?:s|ed|ing)?\s+to\s+(?:the\s+)?(?:feed|home|homepage|list|listing|main|start)\b",
    ),
    (
        "action_word",
        r"\b(?:scroll_down|scroll_up|ipv_[a-z_]+)\b|点击|点开|加购|加入购物车|购物车|滑动|下滑|上滑|退出|返回",
    ),
    ("outcome_word", r"\b(?:buy|buys|buying|bought)\b|\bpurchas(?:e|es|ed|ing)\b(?!\s+power)"),
    (
        "outcome_word",
        r"\b(?:ordered|ordering|reordered)\b|\bplac(?:e|es|ed|ing)\s+(?:an?\s+|the\s+|her\s+|his\s+|their\s+)?orders?\b",
    ),
    # check out in every spelling (checkout, check-out, checks out, checked-out, check it out ...)
    ("outcome_word", rf"{_CHECK_OUT}|\b(?:returned|returning|ended)\b"),
    ("outcome_word", rf"\bend(?:s|ing)?\s+{_POSS}(?:session|visit|browsing|shopping)\b|\bsession\s+end"),
    ("outcome_word", r"\babandon(?:s|ed|ing|ment)?\b|\bconver(?:t|ts|ted|ting|sion|sions)\b"),
    ("outcome_word", r"\b(?:browse|cart)[_-]only\b|\btruncated\b|购买|买了|下单|付款|结算|退货"),
    (
        "step_reference",
        r"\bsteps?\s*(?:#|no\.?|number)?\s*\d+\b|\b(?:action|move|session|visit)\s*(?:#|no\.?)?\s*\d+\b",
    ),
    (
        "step_reference",
        rf"\b{_ORD}\s+(?:steps?|actions?|moves?|sessions?|visits?)\b"
        r"|\b(?:last|final|previous|next|later|earlier)\s+(?:steps?|actions?|moves?|sessions?|visits?)\b",
    ),
    (
        "step_reference",
        r"\b(?:at|in|on|by|near|toward|towards|from|until|after|before)\s+the\s+(?:very\s+)?"
        rf"(?:start|beginning|end|middle)\s+of\s+{_POSS}(?:session|visit|browsing|feed|trajectory|log)\b"
        r"|第\s*[0-9一二三四五六七八九十百]+\s*(?:步|次|轮)",
    ),
    (
        "position_reference",
        rf"\b(?:{_ORD}|last)\s+(?:items?|cards?|products?|listings?|results?|entr(?:y|ies)|positions?|rows?|slots?|tiles?)\b"
        r"|\b(?:items?|cards?|products?|positions?|rows?|slots?|rank|ranked)\s*(?:#|no\.?|number)?\s*\d+\b(?!%)"
        r"|#\d+\b|第\s*[0-9一二三四五六七八九十]+\s*(?:个|件|款|位|行|排)",
    ),
)
LEXICON: tuple[tuple[str, re.Pattern[str]], ...] = tuple((code, re.compile(p)) for code, p in _LEXICON)
# 6+ id characters with a letter and at least three digits ("i_3fa9c2...", "sku12345"); "2-in-1" is not one
_SKU = re.compile(
    r"(?<![a-z0-9_])(?=(?:[a-z_-]*\d){3})(?=[a-z0-9_-]*[a-z])[a-z0-9][a-z0-9_-]{5,}(?![a-z0-9_])"
)
_LONG_DIGITS = re.compile(r"(?<![\d.,])\d{7,}(?![\d.,])")
_NUMBER_WORD = re.compile(r"^\d+(?:[-_][a-z]+)+$")


def word_hits(text: str, codes: Iterable[str] | None = None) -> list[Hit]:
    wanted = set(codes) if codes is not None else None
    return [
        Hit(code, m.group(), m.start(), m.end())
        for code, pattern in LEXICON
        if wanted is None or code in wanted
        for m in pattern.finditer(text)
    ]


def sku_hits(text: str) -> list[Hit]:
    """SKU-like tokens: letters mixed with digits (6+ chars), or 7+ digits in a row."""
    found = [
        Hit("identifier", m.group(), m.start(), m.end())
        for m in _SKU.finditer(text)
        if not _UNIT_LIKE.match(m.group()) and not _NUMBER_WORD.match(m.group())
    ]
    return found + [Hit("identifier", m.group(), m.start(), m.end()) for m in _LONG_DIGITS.finditer(text)]


def _violations(hits: Iterable[Hit]) -> list[Violation]:
    """One violation per (code, span), in text order; a hit inside another of the same code ("cart" in
    "added it to my cart") or an identifier inside an item id is not repeated."""
    out: dict[tuple[str, int, int], Violation] = {}
    ordered = sorted(hits, key=lambda h: (h.start, -h.end))
    ids = [h for h in ordered if h.code in ("item_id", "future_item")]
    kept: list[Hit] = []
    for hit in ordered:
        if hit.code == "identifier" and any(_inside(hit, i) for i in ids):
            continue
        if any(
            k.code == hit.code and _inside(hit, k) and (k.start, k.end) != (hit.start, hit.end) for k in kept
        ):
            continue
        kept.append(hit)
        out.setdefault((hit.code, hit.start, hit.end), Violation(hit.code, hit.match))
    return list(out.values())


def _inside(hit: Hit, outer: Hit) -> bool:
    return outer.start <= hit.start and hit.end <= outer.end


# --- public checks -------------------------------------------------------------------------


def check_intent_text(text: str, index: LeakIndex) -> list[Violation]:
    """Every exclusion of EXTRACTION.md against one trajectory's index."""
    norm = normalize(text)
    return _violations(index.scan(norm) + word_hits(norm) + sku_hits(norm))


def find_leaks(
    text: str,
    *,
    item_ids: Iterable[str],
    titles: Iterable[str],
    prices: Iterable[float],
    identifiers: Iterable[str] = (),
    future_item_ids: Iterable[str] = (),
    future_titles: Iterable[str] = (),
    future_prices: Iterable[float] = (),
    generic_terms: Iterable[str] = (),
) -> list[Violation]:
    """Violations of ``text`` against a trajectory; an empty list means clean.

    ``item_ids``/``titles``/``prices`` are what the trajectory showed so far; the
    ``future_*`` ones are items that appear only later (reported as future_item);
    ``identifiers`` are user/session ids; ``generic_terms`` widen the generic vocabulary
    (category names, parameter values).
    """
    entries = [IndexEntry("seen", item_id=i) for i in item_ids]
    entries += [IndexEntry("seen", title=t) for t in titles] + [IndexEntry("seen", price=p) for p in prices]
    entries += [IndexEntry("future", item_id=i) for i in future_item_ids]
    entries += [IndexEntry("future", title=t) for t in future_titles]
    entries += [IndexEntry("future", price=p) for p in future_prices]
    index = LeakIndex.build(entries, identifiers=identifiers, generic_terms=generic_terms)
    norm = normalize(text)
    hits = [_as_future(h, lambda owner: owner == "future") for h in index.scan(norm)]
    return _violations(hits + word_hits(norm) + sku_hits(norm))


def _as_future(hit: Hit, is_future: Callable[[str], bool]) -> Hit:
    if hit.owners and all(is_future(o) for o in hit.owners):
        return Hit("future_item", hit.match, hit.start, hit.end, hit.owners)
    return hit


# --- rationales ----------------------------------------------------------------------------

_FIRST_PERSON_FUTURE = r"(?:i'll|i will|i'm going to|i am going to|let me|time to|i'm ready to|i am ready to)"
_FIRST_PERSON_NOW = rf"(?:{_FIRST_PERSON_FUTURE}|i'm|i am|i'll keep|i keep|keep)"
_I_DID = r"(?:i|i've|i have|i had|i just|i've just|just)"  # a first-person past claim
_OBJECT = r"(?:(?:it|this|them|that|one|these|those|this\s+one|the\s+\w+)\s+)?"
_CART = r"(?:(?:my|the|a)\s+)?(?:shopping\s+)?(?:cart|basket|trolley|bag)"
_STOP_WHAT = r"(?:shopping|browsing|here|for\s+(?:now|today)|the\s+session)"
_PLACES = r"(?:feed|list|listing|home|homepage|results|main\s+page)"
# "check out" as paying, not as looking at something ("I'll check out the reviews")
_CHECKOUT = r"check(?:ed|ing)?[\s-]?out\b(?!\s+(?:the|this|that|these|those|its|their|more|some|other|an?)\b)"


class Claim(NamedTuple):
    """What a rationale may say it does now (``now``) or did (``done``: reported only when the
    sentence does not place it earlier, "I already added it to my cart")."""

    now: re.Pattern[str]
    done: re.Pattern[str] | None = None


_CLAIMS: dict[str, Claim] = {
    "buy": Claim(
        re.compile(
            rf"\b{_FIRST_PERSON_FUTURE}\s+(?:\w+\s+){{0,2}}?(?:(?:buy|purchase|order)\b|{_CHECKOUT})"
            r"|\b(?:buying|purchasing|ordering)\s+(?:it|this|them)\s+now\b"
            rf"|\bi'm\s+(?:(?:buying|purchasing|ordering)\b|{_CHECKOUT})"
        ),
        re.compile(
            rf"\b{_I_DID}\s+(?:(?:bought|purchased|ordered|paid\s+for)\b|{_CHECKOUT})"
            r"|\b(?:bought|purchased|ordered)\s+(?:it|this|them|that)\b"
        ),
    ),
    "cart": Claim(
        re.compile(
            rf"\b(?:add|adding|put|putting|save|saving|drop|dropping|place|placing|toss|tossing|pop|popping)"
            rf"[\s_-]+{_OBJECT}(?:in|into|to)[\s_-]+{_CART}\b"
        ),
        re.compile(
            rf"\b(?:added|saved|dropped|placed|tossed|popped)[\s_-]+{_OBJECT}(?:in|into|to)[\s_-]+{_CART}\b"
            rf"|\b{_I_DID}\s+carted\b"
        ),
    ),
    "end": Claim(
        re.compile(
            rf"\b{_FIRST_PERSON_FUTURE}\s+(?:stop|quit|finish|end|leave)\s+{_STOP_WHAT}\b"
            rf"|\bi'm\s+(?:done|finished|leaving|quitting|stopping)\s+{_STOP_WHAT}\b"
            r"|\b(?:leave|close|leaving|closing)\s+the\s+app\b"
        ),
        re.compile(
            rf"\b{_I_DID}\s+(?:left|quit|closed|ended|stopped)\s+(?:the\s+(?:app|session|site|shop)|{_STOP_WHAT})\b"
        ),
    ),
    "back": Claim(
        re.compile(
            rf"\b(?:go|head|going|heading|get|getting)\s+back\s+to\s+(?:the\s+)?{_PLACES}\b"
            rf"|\b(?:return|returning)\s+to\s+(?:the\s+)?{_PLACES}\b"
        ),
        re.compile(rf"\b(?:went|headed|got|came|returned)\s+(?:back\s+)?to\s+(?:the\s+)?{_PLACES}\b"),
    ),
    "scroll_down": Claim(
        re.compile(rf"\b{_FIRST_PERSON_NOW}\s+scroll(?:ing)?\s+(?:further\s+|back\s+)?down\b")
    ),
    "scroll_up": Claim(re.compile(rf"\b{_FIRST_PERSON_NOW}\s+scroll(?:ing)?\s+(?:back\s+)?up\b")),
    "scroll": Claim(
        re.compile(rf"\b{_FIRST_PERSON_NOW}\s+scroll(?:ing)?\b(?!\s+(?:further\s+|back\s+)?(?:down|up)\b)")
    ),
}
_DOWN, _UP = frozenset({"scroll_down", "scroll"}), frozenset({"scroll_up", "scroll"})
_ALLOWED_CLAIMS: dict[str, frozenset[str]] = {
    "ipv_buy": frozenset({"buy"}),
    "ipv_cart": frozenset({"cart"}),
    "end": frozenset({"end"}),
    "back_home": frozenset({"back"}),
    "scroll_down": _DOWN,
    "ipv_scroll_down": _DOWN,
    "scroll_up": _UP,
    "ipv_scroll_up": _UP,
}
_NEGATION = re.compile(r"\b(?:not|no|never|without|instead|rather|before|yet)\b|n't")
_EARLIER = re.compile(r"\b(?:already|earlier|previously|before|last\s+time|a\s+moment\s+ago)\b")
_SENTENCE_END = re.compile(r"[.!?;]")


def contradictions(text: str, action: str) -> list[Violation]:
    """First-person claims of doing another action than the recorded one: affirmative ones about now,
    and ones about having done it that the sentence does not place earlier."""
    norm = normalize(text)
    allowed = _ALLOWED_CLAIMS.get(action, frozenset())
    found = []
    for claim, patterns in _CLAIMS.items():
        if claim in allowed:
            continue
        matches = [m for m in patterns.now.finditer(norm) if not _negated(norm, m.start())]
        if patterns.done is not None:
            matches += [m for m in patterns.done.finditer(norm) if not _negated(norm, m.start())]
            matches = [m for m in matches if m.re is patterns.now or not _placed_earlier(norm, m)]
        for m in sorted(matches, key=lambda m: m.start()):
            found.append(Violation("contradicts_action", m.group(), f"claims {claim}, recorded {action}"))
    return found


def _negated(text: str, start: int) -> bool:
    return _NEGATION.search(text[max(0, start - 25) : start]) is not None


def _placed_earlier(text: str, match: re.Match[str]) -> bool:
    """The match's sentence says it happened before now."""
    starts = [m.end() for m in _SENTENCE_END.finditer(text, 0, match.start())]
    end = _SENTENCE_END.search(text, match.end())
    sentence = text[starts[-1] if starts else 0 : end.start() if end else len(text)]
    return _EARLIER.search(sentence) is not None


def check_rationale(
    text: str, *, action: str, index: LeakIndex, is_future: Callable[[str], bool], max_words: int
) -> list[Violation]:
    """EXTRACTION.md's rationale checks: non-empty, length bound, consistent with the action, only
    what is visible now or before (no later steps, no items not yet seen), no identifiers."""
    words = text.split()
    if not words:
        return [Violation("empty", "")]
    problems = (
        [Violation("too_long", f"{len(words)} words", f"limit {max_words}")] if len(words) > max_words else []
    )
    norm = normalize(text)
    hits = [_as_future(h, is_future) for h in index.scan(norm)]
    # Titles and prices of what is on screen are fair game in a reason; ids and unseen items are not.
    kept = [h for h in hits if h.code in ("item_id", "identifier", "future_item")]
    kept += word_hits(norm, codes=("step_reference",)) + sku_hits(norm)
    return problems + contradictions(text, action) + _violations(kept)


def describe(violations: Iterable[Violation]) -> str:
    return "\n".join(f"- {v.describe()}" for v in violations)
