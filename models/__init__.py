"""Model backends behind small protocols (detector, vad, stt, llm, tts, embeddings)."""
