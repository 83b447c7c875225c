"""A model's chat template, rendered exactly as `transformers`' `apply_chat_template` renders it.

Same Jinja set-up as transformers (`ImmutableSandboxedEnvironment` with `trim_blocks`,
`lstrip_blocks` and loop controls; a `tojson` that does not escape HTML; `raise_exception`
and `strftime_now`; `{% generation %}` blocks rendered as their body) and the same variables
(`messages`, `tools`, `documents`, `add_generation_prompt`, and the tokenizer's special tokens
by name: `bos_token`, `eos_token`, ...). Pure: no tokenizer, no files.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

Message = dict[str, Any]


class ChatTemplateError(ValueError):
    """The template failed to render (it raised, or the messages do not fit it)."""


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): rendered as the body."""

    tags = {"generation"}  # noqa: RUF012 (jinja's Extension API)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """One template with the tokenizer's special tokens bound, as transformers passes them."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _compiled(source)
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise ChatTemplateError(f"the chat template does not parse: {error}") from error

    def render(
        self,
        messages: list[Message],
        *,
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.exceptions.TemplateError as error:
            raise ChatTemplateError(f"the chat template refused these messages: {error}") from error


def special_tokens_of(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    """`bos_token`, `eos_token`, ... of a tokenizer_config.json (strings or AddedToken dicts)."""
    out: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = tokenizer_config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out
