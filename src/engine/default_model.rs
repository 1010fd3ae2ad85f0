/// Where the default model lives, relative to the repository root.
pub const DEFAULT_MODEL: &str = "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
