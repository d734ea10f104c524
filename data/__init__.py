"""prove.data — chat datasets (Dolci schema), chat-template tokenization, block collation, generated tasks."""
