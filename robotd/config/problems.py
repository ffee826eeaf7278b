"""What a model validator of the config raises: every rule it found broken, each with the
keys it is about, so that the loader names each one as ``SOURCE: dotted.key: rule`` (the
file, or the --set that gave one of the keys) and reports them all at once."""

from __future__ import annotations

import re
from collections.abc import Iterable

# One broken rule: the keys it is about (dotted, relative to the model that checked it; the
# first is the one named unless a --set gave another; none: the text leads with its own
# full key, "policy.x: ..."), and the rule in words.
Problem = tuple[tuple[str, ...], str]


# A rule's message that starts with the key it is about ("safety.x: needs ...", a
# contract's "policy.observations.streams['top'].at: ...")
LEADING_KEY = re.compile(r"([A-Za-z_][\w\-]*(?:\.[\w\-]+|\[\d+\]|\['[^']*'\])*): ")


def led(text: str, *also: str) -> Problem:
    """A rule's message that leads with its key ("policy.worker: why") as the Problem about
    that key and `also` (without a leading key: about the whole config)."""
    lead = LEADING_KEY.match(text)
    if lead is None:
        return ((), text)
    return ((lead.group(1), *also), text[lead.end() :])


class Problems(ValueError):
    """Every rule a validator found broken (see `Problem`). A ValueError, so that pydantic
    reports it as the validator's error (its ctx holds this exception); its text is the
    problems joined, for formatters that know nothing of it."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{k[0]}: {t}" if k else t for k, t in self.problems))


def raise_any(problems: Iterable[Problem]) -> None:
    """Raise Problems when there are any."""
    found = list(problems)
    if found:
        raise Problems(found)
