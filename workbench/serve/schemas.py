"""The HTTP contract as pydantic models: every request body and response of the server, so the OpenAPI schema
declares them (schemathesis fuzzes it) and FastAPI validates every body before a handler runs.

Requests are strict: an unknown field is refused (its name in the 400), a string is never read as a number or a
boolean, NaN and infinities are refused, and a whole-number float (``10.0``) is accepted where OpenAI's API takes an
integer. Every string must be valid Unicode (a lone surrogate such as ``"\\ud800"`` is a 400). Fields OpenAI defines
that this server does not implement (``tools``, ``response_format``, ``logit_bias``, penalties, ``suffix``, ...) are
declared with the one value that means "not used" (null, 0, empty); any other value is a 400 naming the field.

Limits: ``n`` and the prompts of one completion request at most :data:`MAX_CHOICES` each; stop strings at most
:data:`MAX_STOP` of at most :data:`MAX_STOP_CHARS` characters; ``logprobs`` / ``top_logprobs`` 0..:data:`MAX_LOGPROBS`.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

MAX_CHOICES = 64
MAX_STOP = 16
MAX_STOP_CHARS = 256
MAX_LOGPROBS = 20
MAX_SEED = 2**62


def _whole(v: Any) -> Any:
    """A float with no fractional part as the integer it is (OpenAI accepts ``10.0`` for an integer)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _unicode(s: str) -> str:
    """Refuse a string that cannot be UTF-8 (a lone surrogate from a ``\\ud800`` escape)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid Unicode: {e.reason} at character {e.start}") from None
    return s


def whole(**limits):
    """An integer within ``limits`` (``ge``, ``le``), a whole-number float read as one; the limits stay in the
    JSON schema."""
    return Annotated[int, Field(**limits), BeforeValidator(_whole)]


def unsupported(kind, neutral: dict) -> Any:
    """A field of OpenAI's API this server does not implement: only its neutral value (``neutral``: the JSON
    schema limits that admit only it, e.g. ``{"ge": 0, "le": 0}``) or null."""
    return Annotated[kind, Field(**neutral)] | None


Text = Annotated[str, AfterValidator(_unicode)]
TokenId = whole(ge=0)
ZeroOnly = unsupported(float, {"ge": 0, "le": 0})
OneOnly = unsupported(float, {"ge": 1, "le": 1})
EmptyObject = unsupported(dict[str, float], {"max_length": 0})
EmptyList = unsupported(list[dict[str, Any]], {"max_length": 0})
EmptyText = unsupported(str, {"max_length": 0})
StopString = Annotated[str, AfterValidator(_unicode), Field(min_length=1, max_length=MAX_STOP_CHARS)]


class Strict(BaseModel):
    """Refuses unknown fields, strings as numbers, NaN and infinity."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


class StreamOptions(Strict):
    include_usage: bool | None = Field(False, description="A last chunk with the request's usage.")


class SamplingFields(Strict):
    """Fields both generation endpoints share."""

    model: Text | None = Field(None, description="The served model's id (GET /v1/models); optional.")
    temperature: Annotated[float, Field(ge=0, le=2)] | None = Field(
        None, description="0 (default): greedy argmax; > 0 samples (lossless under DDTree).")
    top_p: Annotated[float, Field(gt=0, le=1)] | None = Field(None, description="Nucleus sampling mass, (0, 1].")
    top_k: whole(ge=-1) | None = Field(None, description="Sample among the k most likely; 0 or -1: off.")
    seed: whole(ge=0, le=MAX_SEED) | None = Field(
        None, description="Same seed and prompt, same tokens (choice i of n uses seed + i).")
    n: whole(ge=1, le=MAX_CHOICES) | None = Field(None, description="Choices per prompt.")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = Field(
        None, description=f"Up to {MAX_STOP} strings of 1..{MAX_STOP_CHARS} characters; the text ends before the "
                          "first one generated.")
    user: Text | None = None
    presence_penalty: ZeroOnly = Field(None, description="Only 0: not implemented.")
    frequency_penalty: ZeroOnly = Field(None, description="Only 0: not implemented.")
    repetition_penalty: OneOnly = Field(None, description="Only 1: not implemented.")
    logit_bias: EmptyObject = Field(None, description="Only {}: not implemented.")


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    prompt: (Annotated[Text, Field(min_length=1)]
             | Annotated[list[TokenId], Field(min_length=1)]
             | Annotated[list[Annotated[Text, Field(min_length=1)]], Field(min_length=1, max_length=MAX_CHOICES)]
             | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]],
                         Field(min_length=1, max_length=MAX_CHOICES)]) = Field(
        description="A string, a list of token ids, or a list of either (one choice set per prompt).")
    max_tokens: whole(ge=0) | None = Field(
        None, description="Tokens to generate (default 16); 0 only with echo (the prompt's log-probs alone).")
    logprobs: whole(ge=0, le=MAX_LOGPROBS) | None = Field(
        None, description="Each token's log-prob and its N most likely alternatives.")
    echo: bool | None = Field(False, description="The prompt before the completion (with its log-probs).")
    best_of: whole(ge=1, le=MAX_CHOICES) | None = Field(None, description="Only equal to n.")
    suffix: EmptyText = Field(None, description="Only '': not implemented.")

    @model_validator(mode="after")
    def _best_of(self):
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise ValueError("best_of is not supported by this server: only equal to n")
        return self


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None


class ResponseFormat(Strict):
    type: Literal["text"]


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_tokens: whole(ge=1) | None = Field(None, description="Deprecated by OpenAI; see below.")
    max_completion_tokens: whole(ge=1) | None = Field(
        None, description="Tokens to generate; wins over max_tokens. Neither: up to the context's end.")
    logprobs: bool | None = Field(False, description="Each generated token's log-prob.")
    top_logprobs: whole(ge=0, le=MAX_LOGPROBS) | None = Field(
        None, description="With logprobs: the N most likely alternatives per token.")
    tools: EmptyList = Field(None, description="Only []: no tools.")
    tool_choice: Literal["none", "auto"] | None = Field(None, description="Only 'none' or 'auto': no tools.")
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = Field(None, description="Only {'type': 'text'}.")

    @model_validator(mode="after")
    def _top_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self


class TokenizePrompt(Strict):
    """POST /tokenize with a prompt (vLLM's)."""

    model: Text | None = None
    prompt: Text
    add_special_tokens: bool | None = True
    return_token_strs: bool | None = False


class TokenizeChat(Strict):
    """POST /tokenize with chat messages, rendered with the chat template (vLLM's)."""

    model: Text | None = None
    messages: list[Message]
    add_generation_prompt: bool | None = True
    add_special_tokens: bool | None = False
    return_token_strs: bool | None = False


TokenizeRequest = TokenizePrompt | TokenizeChat


class DetokenizeRequest(Strict):
    """POST /detokenize (vLLM's)."""

    model: Text | None = None
    tokens: list[TokenId]


# -- responses ---------------------------------------------------------------------------------------------------

class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx/5xx: OpenAI's error object."""

    error: ErrorBody


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class MetaInfo(BaseModel):
    """Per-request speculative-decoding figures, named as SGLang's."""

    prompt_tokens: int
    completion_tokens: int
    spec_verify_ct: int
    spec_accept_length: float | None
    ttft_s: float | None
    e2e_latency_s: float
    queue_s: float | None = None
    method: str


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: Literal["stop", "length"] | None
    logprobs: CompletionLogprobs | None = None
    token_ids: list[int]


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    meta_info: MetaInfo | list[MetaInfo]


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ChatMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: Literal["stop", "length"] | None
    logprobs: ChatLogprobs | None = None
    token_ids: list[int]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    meta_info: MetaInfo | list[MetaInfo]


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int
    method: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    """GET /tokenizer_info (vLLM's; lm-eval's remote tokenizer reads it)."""

    tokenizer_class: str
    eos_token: str | None
    bos_token: str | None
    pad_token: str | None
    chat_template: str
    model_max_length: int
    vocab_size: int


class Health(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: Literal["ok", "down"]
    running: int
    waiting: int
    kv_slots_used: int
    kv_slots_free: int
    kv_slots_reserved: int
    kv_slots: int
    rows: int
    steps: int
