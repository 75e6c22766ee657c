"""Request and response bodies of the HTTP API (pydantic): OpenAI's shapes plus the native routes.

Range checks live here (``Field`` bounds) so that FastAPI's validation names the field and the
limit; checks that need the model (context length, vocabulary) happen in the handlers. Unknown
fields are ignored, as clients often send extras. ``response_format`` of type ``json_object`` (chat
and, as in vLLM, completions) makes the output one valid JSON object, and ``json_schema`` one JSON
value that follows the schema, enforced token by token with a grammar (``engine/grammar.py``).
"""

from __future__ import annotations

import time
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticUndefined


def _admits_none(annotation: Any) -> bool:
    return annotation is None or type(None) in typing.get_args(annotation)


class _Body(BaseModel):
    """A request body: unknown fields ignored, non-finite numbers refused (``Infinity`` is valid
    JSON to Python's parser), and an explicit ``null`` on a field with a default that ``null`` is
    not a value of (``n``, ``stream``, ``echo``, ...) means that default, as OpenAI and vLLM read it
    (SDKs and proxies that write every field send them)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        drop = [
            k
            for k, v in data.items()
            if v is None
            and k in fields
            and fields[k].default is not PydanticUndefined
            and not _admits_none(fields[k].annotation)
        ]
        if not drop:
            return data
        return {k: v for k, v in data.items() if k not in drop}


# -- shared pieces -------------------------------------------------------------------------------
class StreamOptions(_Body):
    include_usage: bool = False


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class _SamplingFields(_Body):
    """Fields shared by chat and completions (OpenAI names, plus vLLM/LMDeploy extensions)."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="-1 or 0 disables top-k")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stop: str | list[str] | None = Field(None, description="stop strings (at most 64)")
    stop_token_ids: list[int] | None = Field(None, max_length=1024)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0)
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: int | None = Field(None, ge=0)
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    response_format: ResponseFormat | None = None
    user: str | None = None
    # vLLM's extension: each prompt token's logprob given the tokens before it, its rank and the
    # top-k alternatives (non-streaming responses only)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    # vLLM's structured-output extensions: guided_json is response_format json_schema by another
    # name; the others are refused by name (params.check_extensions), not silently ignored
    guided_json: dict[str, Any] | str | None = None
    guided_choice: Any = None
    guided_regex: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None


# -- chat ----------------------------------------------------------------------------------------
class TextPart(_Body):
    type: Literal["text"]
    text: str


class ImageURL(_Body):
    url: str
    detail: str | None = None


class ImagePart(_Body):
    type: Literal["image_url"]
    image_url: ImageURL | str


class AudioPart(_Body):
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


class RefusalPart(_Body):
    """An earlier assistant turn's refusal (OpenAI's assistant content parts: text or refusal)."""

    type: Literal["refusal"]
    refusal: str


ContentPart = Annotated[TextPart | ImagePart | AudioPart | RefusalPart, Field(discriminator="type")]


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_needed(self) -> ChatMessage:
        # only an assistant turn (that made tool calls) may come without content, as in OpenAI's API
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role!r} message needs content (a string or a list of parts)")
        return self


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool = True  # False: at most one call per reply
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # (vLLM's; refused when true: params.check_extensions)


class ChatLogprobTop(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(ChatLogprobTop):
    top_logprobs: list[ChatLogprobTop] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatLogprobToken] | None = None


class ToolCallFunction(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)  # (empty without a call, as vLLM)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class PromptLogprob(BaseModel):
    """One entry of vLLM's ``prompt_logprobs`` (keyed by token id)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = None  # (vLLM's extension; the prompt is the choices')


# -- completions ---------------------------------------------------------------------------------
class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[list[int]] | list[str]
    suffix: str | None = None
    max_tokens: int | None = Field(16, ge=0)  # 0: only with echo (score the prompt, as vLLM)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # (vLLM's extension)


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# -- models --------------------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "hotloop"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- native routes -------------------------------------------------------------------------------
class GenerateRequest(_Body):
    """``POST /generate``: a prompt (text or token ids) and LMDeploy ``GenerationConfig`` fields.

    ``max_new_tokens`` absent means "up to session_len". Sampling is off unless ``do_sample``.
    ``do_preprocess`` applies the chat template to a text prompt. ``response_format`` constrains
    the output as on the OpenAI routes (``json_object``, ``json_schema``).
    """

    model: str | None = None
    prompt: str | None = None
    input_ids: list[int] | None = None
    stream: bool = False
    do_preprocess: bool = False
    max_new_tokens: int | None = Field(None, ge=1)
    do_sample: bool = False
    temperature: float = Field(0.8, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    random_seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stop_words: list[str] | None = Field(None, max_length=64)
    stop_token_ids: list[int] | None = Field(None, max_length=1024)
    ignore_eos: bool = False
    min_new_tokens: int | None = Field(None, ge=0)
    skip_special_tokens: bool = True
    logprobs: int | None = Field(None, ge=0, le=20)
    # each prompt token's logprob given the tokens before it (None for the first), with its rank
    # and top-k; in a stream, the first event carries them
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    include_stop_str_in_output: bool = False
    response_format: ResponseFormat | None = None


class GenerateLogprob(BaseModel):
    token_id: int
    logprob: float
    top: dict[int, float] = Field(default_factory=dict)
    rank: int | None = None  # (prompt logprobs: the token's place in its distribution, 1 the first)


class GenerateResponse(BaseModel):
    text: str
    token_ids: list[int]
    input_token_len: int
    generate_token_len: int
    finish_reason: str | None = None
    cached_tokens: int = 0
    logprobs: list[GenerateLogprob] | None = None
    prompt_logprobs: list[GenerateLogprob | None] | None = None


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
