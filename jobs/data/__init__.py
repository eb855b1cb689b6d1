"""Stage 1, text to batches: read and clean the corpus, train the tokenizer, stream packed and corrupted blocks
(Ray Data), and measure that stream."""
