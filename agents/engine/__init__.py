"""The embedded inference engine (SGLang's HTTP contract) and the engine client."""
