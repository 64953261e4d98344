from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("model_id", "prompt", "max_tokens", "temperature", "messages", "top_p", "stop", "seed", "logprobs", "conversation_id")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    prompt: str
    max_tokens: int
    temperature: float
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    top_p: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    logprobs: bool
    conversation_id: str
    def __init__(self, model_id: _Optional[str] = ..., prompt: _Optional[str] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., top_p: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., logprobs: _Optional[bool] = ..., conversation_id: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("text", "finish_reason", "usage", "model_id", "latency_ms", "time_to_first_token_ms")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    text: str
    finish_reason: str
    usage: Usage
    model_id: str
    latency_ms: int
    time_to_first_token_ms: int
    def __init__(self, text: _Optional[str] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., model_id: _Optional[str] = ..., latency_ms: _Optional[int] = ..., time_to_first_token_ms: _Optional[int] = ...) -> None: ...

class TokenMetadata(_message.Message):
    __slots__ = ("log_probability", "latency_ms")
    LOG_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    log_probability: float
    latency_ms: int
    def __init__(self, log_probability: _Optional[float] = ..., latency_ms: _Optional[int] = ...) -> None: ...

class TokenResponse(_message.Message):
    __slots__ = ("token", "index", "is_finished", "metadata", "finish_reason", "usage")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    IS_FINISHED_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    token: str
    index: int
    is_finished: bool
    metadata: TokenMetadata
    finish_reason: str
    usage: Usage
    def __init__(self, token: _Optional[str] = ..., index: _Optional[int] = ..., is_finished: _Optional[bool] = ..., metadata: _Optional[_Union[TokenMetadata, _Mapping]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("data", "sample_rate", "encoding", "channels", "language")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sample_rate: int
    encoding: str
    channels: int
    language: str
    def __init__(self, data: _Optional[bytes] = ..., sample_rate: _Optional[int] = ..., encoding: _Optional[str] = ..., channels: _Optional[int] = ..., language: _Optional[str] = ...) -> None: ...

class TranscriptSegment(_message.Message):
    __slots__ = ("start_s", "end_s", "text")
    START_S_FIELD_NUMBER: _ClassVar[int]
    END_S_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    start_s: float
    end_s: float
    text: str
    def __init__(self, start_s: _Optional[float] = ..., end_s: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class TranscriptResponse(_message.Message):
    __slots__ = ("text", "language", "duration_s", "segments", "latency_ms")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    text: str
    language: str
    duration_s: float
    segments: _containers.RepeatedCompositeFieldContainer[TranscriptSegment]
    latency_ms: int
    def __init__(self, text: _Optional[str] = ..., language: _Optional[str] = ..., duration_s: _Optional[float] = ..., segments: _Optional[_Iterable[_Union[TranscriptSegment, _Mapping]]] = ..., latency_ms: _Optional[int] = ...) -> None: ...

class ConversationConfig(_message.Message):
    __slots__ = ("output_sample_rate", "system_prompt")
    OUTPUT_SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    output_sample_rate: int
    system_prompt: str
    def __init__(self, output_sample_rate: _Optional[int] = ..., system_prompt: _Optional[str] = ...) -> None: ...

class ConversationInput(_message.Message):
    __slots__ = ("config", "audio", "text")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    config: ConversationConfig
    audio: AudioChunk
    text: str
    def __init__(self, config: _Optional[_Union[ConversationConfig, _Mapping]] = ..., audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., text: _Optional[str] = ...) -> None: ...

class TranscriptEvent(_message.Message):
    __slots__ = ("turn", "text", "final")
    TURN_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    turn: int
    text: str
    final: bool
    def __init__(self, turn: _Optional[int] = ..., text: _Optional[str] = ..., final: _Optional[bool] = ...) -> None: ...

class ReplyEvent(_message.Message):
    __slots__ = ("turn", "delta", "done", "interrupted")
    TURN_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    turn: int
    delta: str
    done: bool
    interrupted: bool
    def __init__(self, turn: _Optional[int] = ..., delta: _Optional[str] = ..., done: _Optional[bool] = ..., interrupted: _Optional[bool] = ...) -> None: ...

class AudioOutput(_message.Message):
    __slots__ = ("data", "sample_rate")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sample_rate: int
    def __init__(self, data: _Optional[bytes] = ..., sample_rate: _Optional[int] = ...) -> None: ...

class TurnMetrics(_message.Message):
    __slots__ = ("turn", "speech_ms", "end_of_speech_to_final_ms", "llm_first_token_ms", "first_audio_ms", "voice_to_voice_ms", "barge_in_stop_ms", "prefill", "prefill_saved_ms", "memory_retrieval_ms", "memory_entries", "end_of_turn", "end_of_turn_ms", "turn_score", "turn_model_ms", "final_decode", "speculation", "speculations_discarded", "audio_send_ms", "continues_turn")
    TURN_FIELD_NUMBER: _ClassVar[int]
    SPEECH_MS_FIELD_NUMBER: _ClassVar[int]
    END_OF_SPEECH_TO_FINAL_MS_FIELD_NUMBER: _ClassVar[int]
    LLM_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    FIRST_AUDIO_MS_FIELD_NUMBER: _ClassVar[int]
    VOICE_TO_VOICE_MS_FIELD_NUMBER: _ClassVar[int]
    BARGE_IN_STOP_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SAVED_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_RETRIEVAL_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_MS_FIELD_NUMBER: _ClassVar[int]
    TURN_SCORE_FIELD_NUMBER: _ClassVar[int]
    TURN_MODEL_MS_FIELD_NUMBER: _ClassVar[int]
    FINAL_DECODE_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    SPECULATIONS_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SEND_MS_FIELD_NUMBER: _ClassVar[int]
    CONTINUES_TURN_FIELD_NUMBER: _ClassVar[int]
    turn: int
    speech_ms: float
    end_of_speech_to_final_ms: float
    llm_first_token_ms: float
    first_audio_ms: float
    voice_to_voice_ms: float
    barge_in_stop_ms: float
    prefill: str
    prefill_saved_ms: float
    memory_retrieval_ms: float
    memory_entries: int
    end_of_turn: str
    end_of_turn_ms: float
    turn_score: float
    turn_model_ms: float
    final_decode: str
    speculation: str
    speculations_discarded: int
    audio_send_ms: float
    continues_turn: int
    def __init__(self, turn: _Optional[int] = ..., speech_ms: _Optional[float] = ..., end_of_speech_to_final_ms: _Optional[float] = ..., llm_first_token_ms: _Optional[float] = ..., first_audio_ms: _Optional[float] = ..., voice_to_voice_ms: _Optional[float] = ..., barge_in_stop_ms: _Optional[float] = ..., prefill: _Optional[str] = ..., prefill_saved_ms: _Optional[float] = ..., memory_retrieval_ms: _Optional[float] = ..., memory_entries: _Optional[int] = ..., end_of_turn: _Optional[str] = ..., end_of_turn_ms: _Optional[float] = ..., turn_score: _Optional[float] = ..., turn_model_ms: _Optional[float] = ..., final_decode: _Optional[str] = ..., speculation: _Optional[str] = ..., speculations_discarded: _Optional[int] = ..., audio_send_ms: _Optional[float] = ..., continues_turn: _Optional[int] = ...) -> None: ...

class ConversationEvent(_message.Message):
    __slots__ = ("name", "data_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    data_json: str
    def __init__(self, name: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class ConversationError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ConversationStarted(_message.Message):
    __slots__ = ("session_id", "models")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    models: str
    def __init__(self, session_id: _Optional[str] = ..., models: _Optional[str] = ...) -> None: ...

class ConversationOutput(_message.Message):
    __slots__ = ("ts", "started", "transcript", "reply", "audio", "event", "error", "metrics")
    TS_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ts: float
    started: ConversationStarted
    transcript: TranscriptEvent
    reply: ReplyEvent
    audio: AudioOutput
    event: ConversationEvent
    error: ConversationError
    metrics: TurnMetrics
    def __init__(self, ts: _Optional[float] = ..., started: _Optional[_Union[ConversationStarted, _Mapping]] = ..., transcript: _Optional[_Union[TranscriptEvent, _Mapping]] = ..., reply: _Optional[_Union[ReplyEvent, _Mapping]] = ..., audio: _Optional[_Union[AudioOutput, _Mapping]] = ..., event: _Optional[_Union[ConversationEvent, _Mapping]] = ..., error: _Optional[_Union[ConversationError, _Mapping]] = ..., metrics: _Optional[_Union[TurnMetrics, _Mapping]] = ...) -> None: ...
