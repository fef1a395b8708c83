// The frame of the `openai` npm client tests: BASE_URL and MODEL from the command line, one client
// (no retries), named checks that stop the run at the first failure, and the closing summary.
import OpenAI from 'openai';

export function start_client_test(script) {
  const [baseURL, model] = process.argv.slice(2);
  if (!baseURL || !model) {
    console.error(`usage: node ${script} BASE_URL MODEL`);
    process.exit(2);
  }
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  let checks = 0;
  const check = async (name, fn) => {
    try {
      await fn();
      checks++;
    } catch (e) {
      console.error(`FAIL ${name}: ${e.stack || e}`);
      process.exit(1);
    }
  };
  const finish = () => console.log(`ok ${checks} checks`);
  return { client, model, check, finish };
}
