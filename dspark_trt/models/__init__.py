"""Real target models materialised offline as standard Hugging Face directories (``dspark smollm2``)."""
