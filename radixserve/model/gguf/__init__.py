"""GGUF files as llama.cpp writes them, turned into what the loader reads.

- ``config``: a GGUF file's metadata -> a Hugging Face config, per family
- ``convert``: a GGUF file -> a Hugging Face directory (config, tokenizer, dequantized safetensors)
"""
