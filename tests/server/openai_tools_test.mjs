// Drives megadecode's chat with the official `openai` npm client's tool-calling and streaming
// helpers, against the scripted Qwen3 server of test_server_openai_client.cpp (its replies:
// "Weather in Paris?" -> a get_weather call; a <tool_response> -> "It is sunny in Paris.";
// "Think first" -> reasoning then an answer). Usage: node openai_tools_test.mjs BASE_URL MODEL.
// Exit 0 when all pass.
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import { start_client_test } from './openai_test_harness.mjs';

const { client, model, check, finish } = start_client_test('openai_tools_test.mjs');

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const question = [{ role: 'user', content: 'Weather in Paris?' }];

await check('tool call, not streamed', async () => {
  const r = await client.chat.completions.create({ model, messages: question, tools: [weatherTool] });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.match(call.id, /^call_/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
});

await check('tool call through the stream helper', async () => {
  const fragments = [];
  let done = null;
  const stream = client.chat.completions
    .stream({ model, messages: question, tools: [weatherTool] })
    .on('tool_calls.function.arguments.delta', (e) => fragments.push(e.arguments_delta))
    .on('tool_calls.function.arguments.done', (e) => (done = e));
  const final = await stream.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.function.name, 'get_weather');
  assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris' });
  assert.ok(fragments.length >= 1);
  assert.equal(fragments.join(''), call.function.arguments);
  assert.equal(done.name, 'get_weather');
});

for (const stream of [false, true]) {
  await check(`runTools ${stream ? 'streamed' : 'not streamed'}: call, tool result, answer`, async () => {
    const seen = [];
    const runner = client.chat.completions.runTools({
      model,
      messages: question,
      stream,
      tools: [{
        type: 'function',
        function: {
          name: 'get_weather',
          description: 'The weather in a city.',
          parameters: weatherTool.function.parameters,
          parse: JSON.parse,
          function: ({ city }) => {
            seen.push(city);
            return { city, sky: 'sunny', celsius: 24 };
          },
        },
      }],
    });
    const answer = await runner.finalContent();
    assert.deepEqual(seen, ['Paris']);
    assert.equal(answer, 'It is sunny in Paris.');
    const messages = runner.messages;
    assert.ok(messages.some((m) => m.role === 'tool' && m.content.includes('sunny')));
  });
}

await check('reasoning streams in delta.reasoning_content', async () => {
  const chunks = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Think first' }], stream: true,
  });
  let reasoning = '';
  let content = '';
  for await (const chunk of chunks) {
    for (const c of chunk.choices) {
      if (c.delta.reasoning_content) reasoning += c.delta.reasoning_content;
      if (c.delta.content) content += c.delta.content;
    }
  }
  assert.equal(reasoning, '\nLet me think.\n');
  assert.equal(content, '\n\nDone thinking.');
  const off = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Think first' }], chat_template_kwargs: { enable_thinking: false },
  });
  assert.equal(off.choices[0].message.content, '<think>\nLet me think.\n</think>\n\nDone thinking.');
  assert.equal(off.choices[0].message.reasoning_content, undefined);
});

await check('a schema the server cannot enforce is refused by field, keyword and pointer', async () => {
  const schema = { type: 'object', properties: { a: { type: 'string', pattern: 'a+' } }, required: ['a'] };
  await assert.rejects(
    client.chat.completions.create({
      model, messages: question, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } },
    }),
    (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError);
      assert.equal(e.param, 'response_format');
      assert.ok(e.message.includes('pattern') && e.message.includes('/properties/a'), e.message);
      return true;
    });
});

finish();
