"""Chat layout over token ids, reply parsing, output truncation, and the length controls."""

from __future__ import annotations

from agents.chat import ChatFormat
from agents.identity import group_id, trajectory_id
from agents.limits import next_call_budget, stop_after_call
from agents.scaffold import (
    FormatError,
    parse_reply,
    render_observation,
    split_submit,
    truncate_output,
)
from streams.outcomes import Outcome
from streams.payloads import Limits

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_prompt_and_observation_append_without_retokenising(chat: ChatFormat) -> None:
    prompt = chat.prompt("sys text", "fix the bug")
    text = chat.tokenizer.decode(prompt, skip_special_tokens=False)
    assert text == (
        "<|im_start|>system\nsys text<|im_end|>\n<|im_start|>user\nfix the bug<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    reply = [*chat.encode("ls"), chat.turn_end_id]
    obs = chat.observation(reply, "out")
    whole = chat.tokenizer.decode(prompt + reply + obs, skip_special_tokens=False)
    assert whole.endswith("ls<|im_end|>\n<|im_start|>user\nout<|im_end|>\n<|im_start|>assistant\n")
    # a reply cut by a length cap is closed before the next user turn
    cut = chat.observation(chat.encode("ls"), "out")
    assert cut[0] == chat.turn_end_id
    assert chat.turn_end_id in chat.stop_token_ids


def test_one_bash_block_is_the_action() -> None:
    action = parse_reply("THOUGHT: look\n\n```bash\nls -la\n```\n", SUBMIT)
    assert not isinstance(action, FormatError)
    assert action.command == "ls -la" and not action.submits


def test_format_errors_say_what_was_wrong() -> None:
    none = parse_reply("I think we should look at the files.", SUBMIT)
    two = parse_reply("```bash\nls\n```\nand\n```bash\npwd\n```", SUBMIT)
    empty = parse_reply("```bash\n\n```", SUBMIT)
    assert isinstance(none, FormatError) and "no ```bash block" in none.message
    assert isinstance(two, FormatError) and "found 2" in two.message
    assert isinstance(empty, FormatError) and "empty" in empty.message
    assert isinstance(parse_reply("```python\nprint(1)\n```", SUBMIT), FormatError)


def test_submit_detection() -> None:
    only = parse_reply(f"done\n```bash\n{SUBMIT}\n```", SUBMIT)
    assert not isinstance(only, FormatError) and only.submits and only.command == ""
    chained = split_submit(f"git diff\n  {SUBMIT}  ", SUBMIT)
    assert chained.submits and chained.command == "git diff"
    mentioned = split_submit(f"{SUBMIT}\nls", SUBMIT)
    assert not mentioned.submits


def test_truncation_keeps_head_and_tail_with_elided_count() -> None:
    text = "H" * 6000 + "M" * 5000 + "T" * 6000
    shown = truncate_output(text, 10000)
    assert shown.truncated and shown.elided_chars == 7000
    assert shown.text.startswith("H" * 5000) and shown.text.endswith("T" * 5000)
    assert "[... 7000 characters elided ...]" in shown.text and "M" not in shown.text
    short = truncate_output("hello", 10000)
    assert short.text == "hello" and not short.truncated


def test_observation_shows_exit_code_and_timeout() -> None:
    ok = render_observation(0, "a\nb", 100)
    assert ok.text == "<returncode>0</returncode>\n<output>\na\nb\n</output>"
    late = render_observation(None, "", 100, timed_out=True, timeout_s=30)
    assert "<returncode>timeout</returncode>" in late.text and "timed out after 30 seconds" in late.text


def test_each_cap_is_its_own_outcome() -> None:
    limits = Limits(max_turns=3, max_new_tokens_per_turn=100, max_trajectory_tokens=250, context_cap=1000)
    assert next_call_budget(limits, 3, 0, 10).stop == Outcome.TRUNCATED_TURNS
    assert next_call_budget(limits, 1, 250, 10).stop == Outcome.TRUNCATED_TOKENS
    assert next_call_budget(limits, 1, 0, 1000).stop == Outcome.TRUNCATED_CONTEXT
    free = next_call_budget(limits, 1, 0, 10)
    assert free.stop is None and free.max_new_tokens == 100 and free.bound_by is None
    tokens = next_call_budget(limits, 2, 200, 10)
    assert tokens.max_new_tokens == 50 and tokens.bound_by == Outcome.TRUNCATED_TOKENS
    assert stop_after_call(tokens, 50, "length") == Outcome.TRUNCATED_TOKENS
    assert stop_after_call(tokens, 20, "stop") is None
    context = next_call_budget(limits, 1, 0, 960)
    assert context.max_new_tokens == 40 and context.bound_by == Outcome.TRUNCATED_CONTEXT
    assert stop_after_call(context, 40, "length") == Outcome.TRUNCATED_CONTEXT
    assert stop_after_call(free, 100, "length") is None  # the per-turn cap alone does not end it


def test_identities_are_deterministic_and_distinct() -> None:
    g = group_id("run1", "task-a", 0)
    assert g == group_id("run1", "task-a", 0) != group_id("run1", "task-a", 1)
    assert trajectory_id(g, 0, 0) == trajectory_id(g, 0, 0)
    assert len({trajectory_id(g, a, r) for a in range(8) for r in range(3)}) == 24


def test_offsets_commit_only_below_the_lowest_unfinished_request() -> None:
    from agents.offsets import OffsetTracker

    tracker = OffsetTracker()
    p = ("rollout.requests", 0)
    for offset in (10, 11, 12):
        tracker.started(p, offset)
    assert tracker.committable() == {p: 10}
    tracker.finished(p, 12)
    tracker.finished(p, 11)
    assert tracker.committable() == {p: 10}  # 10 still running: a crash must re-run it
    tracker.mark_committed(tracker.committable())
    assert tracker.committable() == {}
    tracker.finished(p, 10)
    assert tracker.committable() == {p: 13}
    tracker.mark_committed({p: 13})
    tracker.started(("rollout.requests", 1), 0)
    assert tracker.committable() == {("rollout.requests", 1): 0} and tracker.in_flight == 1


def test_a_fence_inside_a_heredoc_does_not_end_the_block() -> None:
    reply = "```bash\ncat <<'EOF' > notes.md\nuse ```python fences``` here\nEOF\n```\n"
    action = parse_reply(reply, SUBMIT)
    assert not isinstance(action, FormatError)
    assert action.command == "cat <<'EOF' > notes.md\nuse ```python fences``` here\nEOF"


def test_offsets_seen_covers_running_and_finished_requests() -> None:
    from agents.offsets import OffsetTracker

    tracker = OffsetTracker()
    p = ("rollout.requests", 3)
    tracker.started(p, 5)
    tracker.started(p, 6)
    tracker.finished(p, 6)
    assert tracker.seen(p, 5) and tracker.seen(p, 6) and not tracker.seen(p, 7)
    tracker.forget({p})  # the partition moved away: a re-delivery after it comes back runs again
    assert not tracker.seen(p, 5)
