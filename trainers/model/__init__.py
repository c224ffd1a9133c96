"""The model being trained: loading it and its tokenizer (`load`), what LoRA adapts in each architecture
(`architecture`), the offline built-in model (`tiny`), GGUF files converted into model folders (`gguf`), folding the
adapter into it (`merge`), and serving it over an OpenAI-compatible HTTP API (`serve`)."""
