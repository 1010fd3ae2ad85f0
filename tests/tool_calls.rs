//! Native tool calling through the engine: the chat template renders tools,
//! calls and tool results as Hugging Face does, and a reply's calls come
//! back the same in-process and through `statebench serve`.

use statebench::backend::{Message, Role, Tool, ToolCall};
use statebench::engine::template::ChatTemplate;

fn fixture_template() -> ChatTemplate {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/engine/tiny-qwen2/tokenizer_config.json"
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    ChatTemplate::new(cfg["chat_template"].as_str().unwrap()).unwrap()
}

/// The Qwen2.5 template over a conversation with a tool, a call, its
/// result and a later turn, compared with the string `transformers`'
/// `apply_chat_template` renders (jinja2 with its `tojson`, the tool as a
/// Python dict in this key order).
#[test]
fn tools_calls_and_results_render_as_transformers_does() {
    let params = serde_json::json!({
        "type": "object",
        "properties": {"work_order": {"type": "string", "description": "the work order number"}},
        "required": ["work_order"]
    });
    let tools = [Tool::function(
        "sign_msa",
        "Carry out step s1: sign the master service agreement.",
        params,
    )];
    let call = ToolCall {
        id: "call_0".into(),
        name: "sign_msa".into(),
        arguments: "{\"work_order\": \"#W1234\"}".into(),
    };
    let messages = [
        Message::new(Role::System, "You run the project."),
        Message::new(Role::User, "Sign the MSA (#W1234)."),
        Message::calls("", vec![call]),
        Message::tool_result("call_0", "sign_msa: executed for work order #W1234."),
        Message::new(Role::Assistant, "Signed."),
        Message::new(Role::User, "Thanks (#W5678)."),
    ];
    let got = fixture_template().render(&messages, &tools, false).unwrap();
    let want = "<|im_start|>system\nYou run the project.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"sign_msa\", \"description\": \"Carry out step s1: sign the master service agreement.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"work_order\": {\"type\": \"string\", \"description\": \"the work order number\"}}, \"required\": [\"work_order\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nSign the MSA (#W1234).<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"sign_msa\", \"arguments\": {\"work_order\": \"#W1234\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsign_msa: executed for work order #W1234.\n</tool_response><|im_end|>\n<|im_start|>assistant\nSigned.<|im_end|>\n<|im_start|>user\nThanks (#W5678).<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(got, want);
    // Without tools the conversation renders as before: no tools block.
    let plain = fixture_template()
        .render(&messages[..2], &[], false)
        .unwrap();
    assert!(!plain.contains("# Tools"), "{plain}");
}
