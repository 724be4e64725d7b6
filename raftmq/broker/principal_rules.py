"""Kafka's ``ssl.principal.mapping.rules``: how a client certificate's subject becomes a
principal name (``raftmq broker --ssl-principal-mapping-rules``).

The rules are a comma-separated list, tried in order on the certificate's subject
distinguished name in RFC 2253 order (most specific first, ``CN=alice,O=acme``), each::

    RULE:pattern/replacement/        the first rule whose pattern matches the whole DN
    RULE:pattern/replacement/L       wins: its replacement ($1, $2: the groups), lowered
    RULE:pattern/replacement/U       or upper-cased with L or U
    DEFAULT                          the DN as it is

A ``/`` inside a pattern or replacement is written ``\\/``. When no rule matches, the
certificate names nobody: its caller is refused. Without rules, DEFAULT alone applies
(Kafka's default): the principal is ``User:`` and the whole DN.

Why a module of its own: the rules are parsed once at start, where a mistake is a start-up
error naming the rule, and are a pure function the unit tests exercise without a broker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RULE = re.compile(
    r"\s*(?:(?P<default>DEFAULT)|RULE:(?P<pattern>(?:\\/|[^/])*)/"
    r"(?P<replacement>(?:\\/|[^/])*)/(?P<case>[LU]?))\s*(?:,|$)"
)


class MappingRuleError(ValueError):
    """The rules text does not parse; the message quotes where."""


class NoMatchingRule(LookupError):
    """No rule matched the distinguished name."""


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        """The name this rule makes of ``dn``, or None when it does not match."""
        if self.pattern is None:
            return dn
        if self.pattern.fullmatch(dn) is None:
            return None
        name = self.pattern.sub(self.replacement, dn, count=1)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


def _java_replacement(text: str) -> str:
    """Java's ``$1`` group references as Python's ``\\g<1>`` (and ``\\/`` as ``/``)."""
    text = text.replace("\\/", "/").replace("\\", "\\\\")
    return re.sub(r"\$(\d+)", r"\\g<\1>", text)


def parse_rules(text: str) -> tuple[Rule, ...]:
    """The rules of ``text`` (empty: DEFAULT alone). Raises MappingRuleError."""
    if not text.strip():
        return (Rule(None),)
    rules: list[Rule] = []
    at = 0
    while at < len(text):
        found = _RULE.match(text, at)
        if found is None or found.end() == at:
            raise MappingRuleError(
                f"--ssl-principal-mapping-rules: cannot read {text[at:]!r}; each rule is "
                "RULE:pattern/replacement/ (then L or U, optionally) or DEFAULT, "
                "separated by commas"
            )
        if found.group("default"):
            rules.append(Rule(None))
        else:
            pattern = found.group("pattern").replace("\\/", "/")
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise MappingRuleError(
                    f"--ssl-principal-mapping-rules: {pattern!r} is not a regular "
                    f"expression ({exc})"
                ) from None
            replacement = _java_replacement(found.group("replacement"))
            rules.append(Rule(compiled, replacement, found.group("case")))
        at = found.end()
    return tuple(rules)


def principal_name(rules: tuple[Rule, ...], dn: str) -> str:
    """The principal's name (without ``User:``) the first matching rule makes of ``dn``;
    raises NoMatchingRule when none matches."""
    for rule in rules:
        name = rule.apply(dn)
        if name is not None:
            return name
    raise NoMatchingRule(dn)
