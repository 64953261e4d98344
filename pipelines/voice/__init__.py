"""The voice loop: VAD -> streaming STT -> streaming LLM -> streaming TTS, interruptible."""
