// The TypeScript SDK's own client, as an IDE extension would use it, driving quanteval-mcp over stdio.
//   MCP_SERVER_ARGV='["quanteval-mcp"]' node ts_client.mjs MODE 'ARGUMENTS_JSON'
// MODE one-call: evaluate_quantization in one tools/call, asking for progress with resetTimeoutOnProgress (the
//   request timeout stays the SDK's default 60 s, restarted by each progress notification);
// MODE plain-call: the same call with the SDK's defaults (no progress asked: it times out at 60 s);
// MODE start-and-wait: start_evaluation, then wait_for_run (timeout_s 45) until the status is not running, defaults.
// Prints {result, error, code, progress, waits, node} as one JSON line (node: the version it ran on).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [command, ...args] = JSON.parse(process.env.MCP_SERVER_ARGV);
const [mode, argumentsJson] = process.argv.slice(2);
const toolArguments = JSON.parse(argumentsJson);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "inherit" });
const client = new Client({ name: "quanteval-ts-test", version: "0.0.0" });
await client.connect(transport);
const out = { progress: 0, waits: 0, node: process.version };
try {
  if (mode === "one-call") {
    out.result = await client.callTool({ name: "evaluate_quantization", arguments: toolArguments }, undefined,
      { onprogress: () => { out.progress += 1; }, resetTimeoutOnProgress: true });
  } else if (mode === "plain-call") {
    out.result = await client.callTool({ name: "evaluate_quantization", arguments: toolArguments });
  } else if (mode === "start-and-wait") {
    const started = await client.callTool({ name: "start_evaluation", arguments: toolArguments });
    out.started = started.structuredContent;
    for (;;) {
      const waited = await client.callTool({ name: "wait_for_run", arguments: { record_id: out.started.record_id, timeout_s: 45 } });
      out.waits += 1;
      if (waited.isError || waited.structuredContent.status !== "running") { out.result = waited; break; }
    }
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
} catch (error) {
  out.error = String(error.message);
  out.code = error.code;
}
console.log(JSON.stringify(out));
await client.close();
