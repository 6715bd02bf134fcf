"""Our Qwen3-style chat template (Jinja) and the format constants the renderer shares with it.

The token-level format is Qwen3's (facts of the format, not anyone's text):

    <|im_start|>system\n{system}\n\n# Tools ... <tools>{schemas}</tools> ...<|im_end|>\n
    <|im_start|>user\n{query}<|im_end|>\n
    <|im_start|>assistant\n{content}\n<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call><|im_end|>\n
    <|im_start|>user\n<tool_response>\n{result}\n</tool_response>\n<tool_response>...<|im_end|>\n
    <|im_start|>assistant\n                      (generation prompt)
    <|im_start|>assistant\n<think>\n\n</think>\n\n   (generation prompt, enable_thinking=False)

Where ours differs from the template shipped with Qwen3 checkpoints, on purpose, so that a full
re-render of an episode equals the ids the sampler produced turn by turn:

* Assistant content is rendered verbatim, ``<think>`` block included, for every turn. The real
  template drops the thinking of assistant turns before the last user query and re-normalises the
  think block of later ones. ``drop_past_thinking=True`` (a template variable) restores the dropping.
* With ``enable_thinking=False`` every assistant turn that has no think block of its own is rendered
  after the empty ``<think>\n\n</think>\n\n`` block, because that is what the generation prompt put
  in front of the model when it sampled the turn. The real template adds it only to the last turn.
* Each tool call is preceded by a newline even when the content is empty (the real template skips
  that newline for an empty content), so every rendered call is parseable by the reference's regex,
  which requires "\n<tool_call>\n". Only a past turn whose thinking ``drop_past_thinking`` removed
  and which has no other content starts with a bare ``<tool_call>``, as in the real template.
* The tool name is JSON-escaped (``tojson``) instead of pasted between quotes.
* The tools preamble (the two instruction sentences of the system block) is worded our own way.
* ``reasoning_content`` is honoured as in the real template (think block, blank line, content), for
  every turn unless ``drop_past_thinking`` drops it from turns before the last user message.

docs/chat_template.md lists every difference with the test that pins it against the official template.
"""

from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"

# Tokens that must never be split by BPE; the first three are control tokens (skipped when decoding
# with skip_special_tokens), the others stay visible in decoded text as in Qwen3.
CONTROL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
MARKUP_TOKENS = (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)
QWEN3_SPECIAL_TOKENS = CONTROL_TOKENS + MARKUP_TOKENS

EMPTY_THINK = "<think>\n\n</think>\n\n"


def generation_prompt(enable_thinking: bool = True) -> str:
    return f"{IM_START}assistant\n" + ("" if enable_thinking else EMPTY_THINK)


def user_turn(content: str) -> str:
    return f"{IM_START}user\n{content}{IM_END}\n"


def tool_responses_turn(contents: list[str]) -> str:
    """Consecutive tool messages share one user turn, one block per response, in call order."""
    blocks = "".join(f"\n{TOOL_RESPONSE_OPEN}\n{c}\n{TOOL_RESPONSE_CLOSE}" for c in contents)
    return f"{IM_START}user{blocks}{IM_END}\n"


QWEN3_STYLE_TEMPLATE = r"""{#- envace-jax Qwen3-style chat template. Variables: messages, tools, add_generation_prompt,
    enable_thinking (default true), drop_past_thinking (default false); assistant messages may carry
    reasoning_content. See envace_jax/chat/template.py. -#}
{%- set thinking = enable_thinking is not defined or enable_thinking -%}
{%- set drop_past = drop_past_thinking is defined and drop_past_thinking -%}
{%- set st = namespace(first=0, last_query=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set st.last_query = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}
  {{- '<|im_start|>system\n' -}}
  {%- if messages and messages[0].role == 'system' -%}
    {{- messages[0].content + '\n\n' -}}
    {%- set st.first = 1 -%}
  {%- endif -%}
  {{- '# Tools\n\nYou can use the functions described below to help with the user\'s request.\n\n' -}}
  {{- 'Each function signature is a JSON object on its own line inside <tools></tools>:\n<tools>' -}}
  {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\n</tools>\n\nTo call a function, write one JSON object with its name and arguments ' -}}
  {{- 'between <tool_call></tool_call> tags, like this:\n' -}}
  {{- '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages and messages[0].role == 'system' -%}
  {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' -}}
  {%- set st.first = 1 -%}
{%- endif -%}
{%- for m in messages -%}
  {%- set text = m.content if m.content is string else '' -%}
  {%- if loop.index0 < st.first -%}
  {%- elif m.role == 'user' or m.role == 'system' -%}
    {{- '<|im_start|>' + m.role + '\n' + text + '<|im_end|>\n' -}}
  {%- elif m.role == 'assistant' -%}
    {%- set past = drop_past and loop.index0 < st.last_query -%}
    {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
    {%- if reasoning and not past -%}
      {#- The official layout: think block, blank line, content; a call right after the think block gets
          its "\n" from the call loop below, as for an empty content. -#}
      {%- set rest = text.lstrip('\n') -%}
      {%- set text = '<think>\n' + reasoning.strip('\n') + '\n</think>\n'
                     + ('\n' + rest if rest or not m.tool_calls else '') -%}
    {%- elif past and '</think>' in text and m.reasoning_content is not string -%}
      {%- set text = text.split('</think>')[-1].lstrip('\n') -%}
    {%- endif -%}
    {%- if not thinking and not past and not text.startswith('<think>') -%}
      {%- set text = '<think>\n\n</think>\n\n' + text -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' + text -}}
    {%- for call in (m.tool_calls or []) -%}
      {%- set fn = call.function if call.function is defined else call -%}
      {%- if text or not past or not loop.first -%}{{- '\n' -}}{%- endif -%}
      {{- '<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
      {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
      {{- '}\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
  {%- elif m.role == 'tool' -%}
    {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\n<tool_response>\n' + text + '\n</tool_response>' -}}
    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
  {%- else -%}
    {{- raise_exception('chat template: unsupported message role ' + (m.role | string)) -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if not thinking -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}"""


def render_chat_text(
    messages: list[dict],
    tools: list[dict] | None = None,
    *,
    add_generation_prompt: bool = False,
    enable_thinking: bool = True,
    drop_past_thinking: bool = False,
    chat_template: str = QWEN3_STYLE_TEMPLATE,
) -> str:
    """Renders messages with a chat template without needing a tokenizer (e.g. to build a corpus).

    Uses transformers' own Jinja environment so filters (``tojson`` without HTML escaping) behave
    exactly as under ``tokenizer.apply_chat_template``.
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
        enable_thinking=enable_thinking,
        drop_past_thinking=drop_past_thinking,
    )
    return rendered[0]
