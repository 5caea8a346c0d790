"""The scoring pipeline, a module per stage: prompts -> tokenize -> compiler -> tree -> packer -> runner -> scorer -> responses."""
