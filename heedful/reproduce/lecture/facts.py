"""Lecture report, the factual prompts of the causal-tracing section: countries with their
capital and official language, written into two templates whose subject (the country) sits just
before the end, as in Meng et al. (2022)'s ``(subject, relation, object)`` prompts. Only the
prompts the language model completes correctly (greedy top-1 next token = the object's first
token) are traced (:func:`heedful.reproduce.lecture.run.correct_facts`)."""

from __future__ import annotations

from dataclasses import dataclass

TEMPLATES = {
    "capital": "The capital of {} is",
    "language": "The official language of {} is",
}
"""Relation -> prompt template (the subject fills the braces)."""

COUNTRIES: tuple[tuple[str, str | None, str | None], ...] = (
    # (country, capital, official language); None where the fact is ambiguous or multi-word
    ("France", "Paris", "French"), ("Germany", "Berlin", "German"), ("Italy", "Rome", "Italian"),
    ("Spain", "Madrid", "Spanish"), ("Portugal", "Lisbon", "Portuguese"), ("Japan", "Tokyo", "Japanese"),
    ("China", "Beijing", "Chinese"), ("Russia", "Moscow", "Russian"), ("Greece", "Athens", "Greek"),
    ("Egypt", "Cairo", "Arabic"), ("Poland", "Warsaw", "Polish"), ("Austria", "Vienna", "German"),
    ("Sweden", "Stockholm", "Swedish"), ("Norway", "Oslo", "Norwegian"), ("Finland", "Helsinki", "Finnish"),
    ("Denmark", "Copenhagen", "Danish"), ("the Netherlands", "Amsterdam", "Dutch"), ("Ireland", "Dublin", None),
    ("England", "London", "English"), ("Hungary", "Budapest", "Hungarian"), ("Turkey", "Ankara", "Turkish"),
    ("Iran", "Tehran", "Persian"), ("Iraq", "Baghdad", "Arabic"), ("Israel", "Jerusalem", "Hebrew"),
    ("Thailand", "Bangkok", "Thai"), ("Vietnam", "Hanoi", "Vietnamese"), ("Indonesia", "Jakarta", "Indonesian"),
    ("Kenya", "Nairobi", None), ("Argentina", "Buenos", "Spanish"), ("Brazil", None, "Portuguese"),
    ("Mexico", None, "Spanish"), ("Peru", "Lima", "Spanish"), ("Chile", "Santiago", "Spanish"),
    ("Cuba", "Havana", "Spanish"), ("Canada", "Ottawa", None), ("Australia", "Canberra", "English"),
    ("the Czech Republic", "Prague", "Czech"), ("Romania", "Bucharest", "Romanian"), ("Bulgaria", "Sofia", "Bulgarian"),
    ("Serbia", "Belgrade", "Serbian"), ("Croatia", "Zagreb", "Croatian"), ("Syria", "Damascus", "Arabic"),
    ("Lebanon", "Beirut", "Arabic"), ("Jordan", "Amman", "Arabic"), ("Saudi Arabia", "Riyadh", "Arabic"),
    ("Pakistan", "Islamabad", "Urdu"), ("Afghanistan", "Kabul", None), ("Nepal", "Kathmandu", "Nepali"),
    ("South Korea", "Seoul", "Korean"), ("North Korea", "Pyongyang", "Korean"), ("the Philippines", "Manila", None),
    ("Iceland", "Reykjavik", "Icelandic"), ("Latvia", "Riga", "Latvian"), ("Lithuania", "Vilnius", "Lithuanian"),
    ("Estonia", "Tallinn", "Estonian"), ("Slovakia", "Bratislava", "Slovak"), ("Venezuela", "Caracas", "Spanish"),
    ("Morocco", "Rabat", "Arabic"), ("Nigeria", "Abuja", "English"), ("Ghana", "Accra", "English"),
    ("Mongolia", "Ulaanbaatar", "Mongolian"), ("Colombia", "Bogota", "Spanish"), ("Ukraine", None, "Ukrainian"),
)


@dataclass(frozen=True)
class Fact:
    """One prompt: ``prompt`` (the template with the ``subject`` filled in), the ``relation`` and
    the expected next word ``answer`` (with its leading space)."""

    relation: str
    subject: str
    prompt: str
    answer: str


def candidate_facts() -> list[Fact]:
    """Every (country, relation) prompt with a known object: each country's capital prompt then
    its language prompt, so that a prefix of the list mixes both relations."""
    found: list[Fact] = []
    for country, capital, language in COUNTRIES:
        for relation, obj in (("capital", capital), ("language", language)):
            if obj is not None:
                found.append(Fact(relation, country, TEMPLATES[relation].format(country), " " + obj))
    return found
