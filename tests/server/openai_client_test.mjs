// Drives a running megadecode server with the official `openai` npm client: completions and chat,
// streaming and not, usage, stop strings, n, seed reproducibility, and the errors the client maps
// to exception classes. Usage: node openai_client_test.mjs BASE_URL MODEL. Exit 0 when all pass.
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { start_client_test } from './openai_test_harness.mjs';

const { client, model, check, finish } = start_client_test('openai_client_test.mjs');

function validUsage(u) {
  assert.ok(u.prompt_tokens > 0);
  assert.ok(u.completion_tokens > 0);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');
}

const greedy = { temperature: 0, max_tokens: 24 };
const messages = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something.' }];

await check('models', async () => {
  const list = await client.models.list();
  assert.ok(list.data.some((m) => m.id === model));
});

let completionText = '';
await check('completion', async () => {
  const r = await client.completions.create({ model, prompt: 'The quick brown fox', ...greedy });
  assert.equal(r.object, 'text_completion');
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.choices.length, 1);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  validUsage(r.usage);
  completionText = r.choices[0].text;
});

await check('completion stream equals non-stream', async () => {
  const stream = await client.completions.create({
    model, prompt: 'The quick brown fox', ...greedy, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, completionText);
  assert.ok(finish);
  validUsage(usage);
});

let chatText = '';
await check('chat', async () => {
  const r = await client.chat.completions.create({ model, messages, ...greedy });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  validUsage(r.usage);
  chatText = r.choices[0].message.content;
});

await check('chat stream equals non-stream', async () => {
  const stream = await client.chat.completions.create({
    model, messages, ...greedy, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let role = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) text += c.delta.content;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, chatText);
  validUsage(usage);
});

await check('stop string', async () => {
  const full = completionText;
  if (full.length < 4) return;
  const stop = full.slice(2, 4);
  const r = await client.completions.create({ model, prompt: 'The quick brown fox', ...greedy, stop: [stop] });
  assert.equal(r.choices[0].text, full.slice(0, full.indexOf(stop)));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

await check('n and seed reproducibility', async () => {
  const req = { model, messages, max_tokens: 12, temperature: 1.0, seed: 42, n: 3 };
  const a = await client.chat.completions.create(req);
  const b = await client.chat.completions.create(req);
  assert.equal(a.choices.length, 3);
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
  assert.deepEqual(a.choices.map((c) => c.message.content), b.choices.map((c) => c.message.content));
  const c = await client.chat.completions.create({ ...req, seed: 43, n: 1 });
  assert.equal(c.choices[0].message.content, a.choices[1].message.content, 'choice i samples with seed + i');
});

await check('vLLM extras through the body', async () => {
  const r = await client.completions.create({
    model, prompt: 'Extras', max_tokens: 6, temperature: 0.7, top_k: 5, min_p: 0.05, ignore_eos: true, min_tokens: 6,
    repetition_penalty: 1.1, seed: 7,
  });
  assert.equal(r.usage.completion_tokens, 6);
});

await check('logprobs', async () => {
  const r = await client.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0, logprobs: true, top_logprobs: 2 });
  const content = r.choices[0].logprobs.content;
  assert.ok(content.length >= 1);
  for (const t of content) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 2);
  }
});

await check('errors', async () => {
  await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: 'x' }), (e) => {
    assert.ok(e instanceof OpenAI.NotFoundError, `got ${e.constructor.name}`);
    assert.equal(e.status, 404);
    assert.match(e.message, /does not exist/);
    return true;
  });
  await assert.rejects(client.completions.create({ model, prompt: 'x', temperature: -1 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, 'temperature');
    return true;
  });
  await assert.rejects(client.completions.create({ model, prompt: 'x', max_tokens: 10_000_000 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.match(e.message, /maximum context length/);
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model, messages: [] }), OpenAI.BadRequestError);
});

finish();
