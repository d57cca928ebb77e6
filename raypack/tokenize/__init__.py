"""Text to tokens: the tokenizer adapters, one tokenize task, the tokenize run and its corpus format."""
