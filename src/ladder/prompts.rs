//! Every string the experiment sends: the paper's Appendix B.1, verbatim, and
//! the few strings statebench adds, each marked as ours.
//!
//! The paper prints its prompts with list items run together on one line (a
//! typesetting artefact); here each list item and paragraph is its own line.
//! Typographic quotes in the paper are the ASCII apostrophes of the code.
//! Nothing else is changed.

/// Brief, opening paragraph (B.1).
pub const BRIEF_OPENING: &str = "You are my project agent. Here is the full project plan. Perform steps ONLY when I ask for them, and only when their prerequisites are complete.";

/// Brief, policy paragraph after the step list (B.1).
pub const BRIEF_POLICY: &str = "The 'requires:' lists above are authoritative client policy -- some orderings may differ from what you would normally assume, and steps without a 'requires:' list have NO prerequisites. Follow the plan as written, never your assumptions.";

/// The amended brief's one-shot sentence, inserted between the policy paragraph and the protocol (B.1).
pub const ONE_SHOT: &str = "Each step is performed ONCE. If I mention or ask about a finished step again without explicitly ordering a redo, confirm that it is done and do not book a new work order for it.";

/// The text protocol's execution paragraph (B.1).
pub const EXECUTION_PROTOCOL: &str = "EXECUTION PROTOCOL (mandatory): every request I send carries a work order number like #W1234. When you carry out a step, your reply MUST include the line 'ref <completion code>/<work order>' for that execution (e.g. 'ref RC-2048/#W1234') -- this books the work. Never write a ref line for work you are not performing in this reply. If a step's prerequisites are incomplete, do not perform it -- say what is missing instead. If a step has been cancelled, decline it.";

/// The tool protocol's clause, replacing the execution paragraph (B.1, Appendix G).
pub const TOOL_CLAUSE: &str = "TOOLS: to carry out a step, emit exactly one line in your reply: ACTION {\"tool\": \"<tool name>\", \"work_order\": \"#W1234\"} using the work order number from my current message. The system executes it and returns a result. Never emit an ACTION for work you should not perform in this turn; if a step is blocked or cancelled, say why instead.";

/// Ours: the tool clause of the native tool harness (Appendix G's clause with
/// the ACTION line replaced by a call of the step's tool, which the chat
/// template offers).
pub const NATIVE_TOOL_CLAUSE: &str = "TOOLS: to carry out a step, call its tool with one argument, work_order, set to the work order number from my current message (e.g. \"#W1234\"). The system executes the call and returns a result. Never call a tool for work you should not perform in this turn; if a step is blocked or cancelled, say why instead.";

/// Ours: a step tool's description in the native tool harness.
pub fn tool_description(step: &str, wording: &str) -> String {
    format!("Carry out step {step}: {wording}. Stamps the work order into the project workspace.")
}

/// Ours: the description of a step tool's one argument.
pub const WORK_ORDER_ARGUMENT: &str = "the work order number from the current message, e.g. #W1234";

/// Ours: a step tool's result: the stamp it wrote.
pub fn tool_executed(tool: &str, work_order: &str) -> String {
    format!("{tool}: executed for work order {work_order}.")
}

/// Ours: a failed call's result under the tool-faults probe (`why` says
/// how it failed; nothing ran).
pub fn tool_failed(tool: &str, work_order: &str, why: &str) -> String {
    format!("{tool}: FAILED for work order {work_order} -- {why}; nothing was executed. The error is transient: the call may be retried.")
}

/// Ours: the user-role message that carries the tool protocol's results
/// back within the turn when a call failed (tool-faults probe).
pub fn tool_results(results: &[String]) -> String {
    format!("[TOOL RESULTS]\n{}", results.join("\n"))
}

/// Ours: the escalation probe's sentence after a refusal naming a step.
pub fn escalation_offer(step: &str) -> String {
    format!("If the user wants it anyway, you may ask them to authorize it: write the line 'ESCALATE {step}' in your reply; nothing is booked unless they authorize it.")
}

/// Ours: the scripted user's grant of an escalation.
pub fn escalation_granted(step: &str, work_order: &str) -> String {
    format!("Yes -- I authorize {step} again for this request, work order {work_order}. Go ahead.")
}

/// Ours: the scripted user's refusal of an escalation.
pub fn escalation_declined(step: &str) -> String {
    format!("No -- I do not authorize {step}; leave it as it is and book nothing for it.")
}

/// Ours: the result of a call the harness could not read (no booking).
pub fn tool_malformed(tool: &str, why: &str) -> String {
    format!("{tool}: NOT executed -- the call was malformed ({why}). Call it with {{\"work_order\": \"#W1234\"}}.")
}

/// Ours: the result of a call naming no tool of the project.
pub fn tool_unknown(tool: &str) -> String {
    format!("{tool}: no such tool in this project; nothing was executed.")
}

/// Ours: a refused call's result in the native tool harness (the B.1
/// rejection notice, worded for a call).
pub fn call_rejected(call: &str, reason: &str) -> String {
    format!(
        "[CALL REJECTED] Your call {call} was REJECTED -- {reason}; that work was NOT executed."
    )
}

/// Ours: the self-ledger arm's instruction, appended to the brief (the paper describes it, §3.3, but does not print it).
pub const LEDGER_CLAUSE: &str = "LEDGER PROTOCOL (mandatory): keep your own status ledger of the plan. At the end of every reply, write one line for each step whose status you changed in that reply: 'LEDGER <completion code> DONE', 'LEDGER <completion code> CANCELLED' or 'LEDGER <completion code> TODO'. Your ledger is shown back to you with every message.";

/// Checklist header (B.1).
pub const CHECKLIST_HEADER: &str =
    "[PROJECT CHECKLIST -- kept up to date automatically from booked work orders]";

/// Ours: header of the self-ledger rendered back in the checklist's slot.
pub const LEDGER_HEADER: &str = "[YOUR LEDGER -- as you recorded it]";

/// Ours: the ledger rendering when the agent has recorded nothing yet.
pub const LEDGER_EMPTY: &str = "(no entries yet)";

/// Ours: header of the retrieval-memory arms' recall block (the paper names
/// the block, Appendix F, but does not print it).
pub const RECALL_HEADER: &str = "[MEMORY -- recalled for this request]";

/// Ours: the recall block when the memory holds nothing yet.
pub const RECALL_EMPTY: &str = "(nothing recalled)";

/// Ours: how many memories the recall block holds at most (the paper's top-5).
pub const RECALL_K: usize = 5;

/// Ours: the query an embedding of the current request is made from; the
/// instruction form of Qwen3-Embedding's queries (memories are embedded as
/// they are).
pub fn recall_query(message: &str) -> String {
    format!("Instruct: Given a project operator's latest message, retrieve the memories that bear on it\nQuery:{message}")
}

/// Ours: one past exchange as the top-k memory stores it.
/// Ours: one tool call and its result inside a stored reply (native harness).
pub fn memory_call(name: &str, arguments: &str, result: &str) -> String {
    format!("[called {name}({arguments}) -> {result}]")
}

pub fn exchange_memory(user: &str, reply: &str) -> String {
    format!("USER: {user}\nASSISTANT: {reply}")
}

/// Ours: the Mem0-style writer's prompt (one call per exchange; the
/// operations are Mem0's ADD / UPDATE / DELETE / NONE over short facts).
pub fn memory_writer_prompt(facts: &[(u32, String)], user: &str, reply: &str) -> String {
    let memory = if facts.is_empty() {
        "(empty)".to_string()
    } else {
        facts
            .iter()
            .map(|(id, t)| format!("{id}: {t}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "You maintain the long-term memory of an assistant that runs a project for an operator. The memory is a list of short facts, each with an id.\n\nCURRENT MEMORY:\n{memory}\n\nNEW EXCHANGE:\nUSER: {user}\nASSISTANT: {reply}\n\nUpdate the memory with what this exchange establishes. For each fact: ADD a new fact, UPDATE an existing fact it changes (keep its id), DELETE a fact it makes false, or NONE. Keep facts short and self-contained; copy step ids, completion codes, work-order numbers and statuses exactly as written.\nJSON only: {{\"memory\": [{{\"event\": \"ADD\", \"text\": \"...\"}}, {{\"event\": \"UPDATE\", \"id\": 3, \"text\": \"...\"}}, {{\"event\": \"DELETE\", \"id\": 2}}]}} (an empty list when nothing changes)"
    )
}

/// Directive: cancelled step (B.1).
pub fn directive_cancelled(step: &str) -> String {
    format!("[TASK-STATE] step {step} was CANCELLED. Decline; do not perform it.")
}

/// Directive: finished step, no authorization (B.1).
pub fn directive_done(step: &str) -> String {
    format!("[TASK-STATE] step {step} is already DONE. Do not redo it; refer to the earlier completion without booking a new work order.")
}

/// Directive: finished step whose redo the user authorized (B.1).
pub fn directive_redo(step: &str) -> String {
    format!("[TASK-STATE] step {step} is DONE but the user explicitly authorizes re-execution. Perform it again now, booking the NEW work order.")
}

/// Directive: blocked step with its missing prerequisites (B.1).
pub fn directive_blocked(step: &str, missing: &[String]) -> String {
    format!(
        "[TASK-STATE] step {step} is BLOCKED -- missing prerequisites: {}. Do not perform it; say what is pending.",
        missing.join(", ")
    )
}

/// Directive: eligible step (B.1).
pub fn directive_eligible(step: &str) -> String {
    format!("[TASK-STATE] step {step} is ELIGIBLE. Execute it now.")
}

/// Ours: the matched-step-only line of the E.2 control (names the step, gives no instruction).
pub fn matched_step_line(step: &str) -> String {
    format!("[TASK-STATE] this message refers to step {step}.")
}

/// Rejection notice (B.1); `reason` is e.g. "step s3 is BLOCKED".
pub fn rejection_notice(line: &str, reason: &str) -> String {
    format!(
        "[BOOKING REJECTED] Your line '{line}' was REJECTED -- {reason}; that work was NOT booked."
    )
}

/// Matcher prompt (B.1); `steps` is the rendered step list, one "- sX: wording" per line.
pub fn matcher_prompt(steps: &str, message: &str) -> String {
    format!(
        "You route user messages for a project agent. Steps:\n{steps}\nUSER MESSAGE: {message}\nWhich single step (if any) is this message asking the agent to perform or asking about? Is the user EXPLICITLY authorizing re-execution of an already-completed step (redo/again with a stated reason)?\nJSON only: {{\"step\": \"sX\" or null, \"explicit_redo\": true or false}}"
    )
}

/// Ours: the one correction re-ask after a malformed matcher or compiler reply.
pub const JSON_CORRECTION: &str =
    "Your reply was not valid JSON of the requested shape. Reply again with the JSON only.";

/// Compiler graph prompt, appended to the brief (B.1).
pub const COMPILE_GRAPH: &str = "Extract the project plan above as JSON, one entry per step: {\"steps\": {\"s1\": {\"deps\": [], \"code\": \"RC-1234\"}, ...}} deps = exactly the step ids in that step's 'requires:' list (empty list if none); code = that step's completion code. Include every step. JSON only, no commentary.";

/// Compiler revision prompt (B.1); `steps` is the rendered step list.
pub fn compile_revision_prompt(steps: &str, revision: &str) -> String {
    format!(
        "Known project steps:\n{steps}\nPROJECT UPDATE: {revision}\nExtract the update as JSON: {{\"cancel\": \"sX\", \"rewires\": {{\"sY\": [\"sA\", \"sB\"]}}, \"relax\": [\"sZ\", \"sD\"]}} \"cancel\" = the step cancelled entirely; \"rewires\" = for each step whose prerequisite list changed because of the cancellation, its FULL remaining prerequisite list; \"relax\" = [step, dropped_prerequisite] if one step separately dropped a single prerequisite, else null. JSON only."
    )
}

/// Revision message opening (B.1's example).
pub fn revision_cancel(step_wording: &str) -> String {
    format!("Change of plan from the client: CANCEL the step '{step_wording}' entirely -- it is no longer needed.")
}

/// Ours: one rewired step's full remaining prerequisites, in the revision message.
pub fn revision_rewire(step_wording: &str, remaining: &[&str]) -> String {
    if remaining.is_empty() {
        format!("As a result, '{step_wording}' now has NO prerequisites.")
    } else {
        format!(
            "As a result, '{step_wording}' now requires exactly: {}.",
            quote_list(remaining)
        )
    }
}

/// Ours: the relaxed prerequisite, with the step's full remaining prerequisites.
pub fn revision_relax(step_wording: &str, dropped: &str, remaining: &[&str]) -> String {
    let rest = if remaining.is_empty() {
        "it now has NO prerequisites".to_string()
    } else {
        format!("it now requires exactly: {}", quote_list(remaining))
    };
    format!("Separately, '{step_wording}' no longer needs to wait for '{dropped}'; {rest}.")
}

/// Ours: an ambiguous probe naming two eligible steps without saying which (A.5).
pub fn ambiguous_probe(a: &str, b: &str) -> String {
    format!("Take care of the next item -- either {a} or {b}, whichever makes sense")
}

/// Ours: a canned reply the scripted agents use when no step is to be executed.
pub const SCRIPTED_ACK: &str = "Noted.";

fn quote_list(items: &[&str]) -> String {
    items
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Ours: the held-out rewriter's prompt (A.5 describes the rewriter, not its prompt).
pub fn paraphrase_prompt(canonical: &str, wording: &str) -> String {
    format!(
        "Rewrite the following request from a client to their project agent so that it says the same thing in different words. Keep it one sentence, keep it a request, and keep the work it refers to recognizable ({canonical}), but do not reuse the original wording. Reply with the rewritten request only.\n\nRequest: {wording}"
    )
}
