"""A request's stream keeps no times of its own: its output carries the record the feed's
collector folds from the engine's events, which is the engine's own record, and a request
that moved to another engine ends with its whole journey (the first engine's start, the
second's end). Driven without an asyncio consumer: the streams' queues are read after."""

import asyncio
import dataclasses

from minicb import SamplingParams
from minicb.core.request import RequestOutput
from minicb.driver.request_stream import STREAM_KINDS, RequestStream, StreamFeed
from minicb.telemetry.request_times import continued
from tests.helpers import fake_engine

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


class Loop:
    """Just what a stream calls of its consumer's event loop, run at once."""

    def call_soon_threadsafe(self, fn, *args):
        fn(*args)


def opened(engine, feed: StreamFeed, prompt: list[int], params=PARAMS) -> RequestStream:
    now = engine.clock()  # as the engine loop does: one reading for the request and its stream
    rid = engine.add_request(prompt, params, arrival_time=now)
    stream = RequestStream(rid, Loop(), None, prompt, queue=asyncio.Queue())
    feed.open(stream, now)
    return stream


def items(stream: RequestStream) -> list:
    return [stream.queue.get_nowait() for _ in range(stream.queue.qsize())]


def test_a_streams_output_carries_the_engines_record():
    engine = fake_engine(step_times=[0.1, 0.4, 0.2] * 20, max_num_seqs=2)
    feed = StreamFeed({})
    engine.bus.subscribe(feed, kinds=STREAM_KINDS)
    shared = [9] * 32
    streams = [opened(engine, feed, shared + [i]) for i in range(3)]
    engine.step()
    streams.append(opened(engine, feed, shared + [7, 7]))  # arrives mid-run, finds a prefix
    outputs = {o.request_id: o for o in engine.run_until_done()}
    for stream in streams:
        *deltas, out = items(stream)
        assert isinstance(out, RequestOutput) and len(deltas) == 4
        want = outputs[stream.request_id]
        assert (out.token_ids, out.finish_reason) == (want.token_ids, want.finish_reason)
        assert dataclasses.asdict(out.metrics) == dataclasses.asdict(want.metrics)
    assert outputs[streams[-1].request_id].metrics.num_cached_tokens > 0
    assert feed.streams == {} and feed.times.records == {}  # nothing kept once ended


def test_a_moved_request_ends_with_its_whole_journey():
    prefill, decode = fake_engine(step_time=0.1), fake_engine(step_time=0.3, start=5.0)
    feeds = {"prefill": StreamFeed({}), "decode": StreamFeed({})}
    prefill.bus.subscribe(feeds["prefill"], kinds=STREAM_KINDS)
    decode.bus.subscribe(feeds["decode"], kinds=STREAM_KINDS)
    first = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    stream = opened(prefill, feeds["prefill"], [5, 6, 7], first)
    stream.moving = True  # as OpenStreams.hold marks it before its end on the prefill side
    (started,) = prefill.run_until_done()
    assert feeds["prefill"].streams == {stream.request_id: stream}  # held through that end
    feeds["prefill"].streams.pop(stream.request_id)  # OpenStreams.move
    rid = decode.add_request([5, 6, 7, *started.token_ids], PARAMS)
    stream.request_id, stream.moving = rid, False
    feeds["decode"].open(stream, None)
    (ended,) = decode.run_until_done()
    out = items(stream)[-1]
    assert dataclasses.asdict(out.metrics) == dataclasses.asdict(
        continued(started.metrics, ended.metrics)
    )
    end = ended.metrics.finished_time
    assert (out.metrics.arrival_time, out.metrics.finished_time) == (0.0, end)  # not 5.0
