// A real MCP client from the TypeScript SDK (npm @modelcontextprotocol/sdk, installed by
// scripts/install-mcp-ts-client.sh), driven by tests/integration/test_mcp_ts_client.py.
// argv[2]: the SDK's package directory; argv[3]: a JSON plan {url, headers, calls: [{name,
// arguments, meta?}]}. Prints one JSON object: the listed tools and, per call, the SDK's result or
// the error the SDK raised (a result it rejects, e.g. -32602 for one its outputSchema refuses).
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdkDir, planText] = process.argv.slice(2);
const esm = (file) => import(pathToFileURL(path.join(sdkDir, "dist", "esm", file)).href);
const { Client } = await esm("client/index.js");
const { StreamableHTTPClientTransport } = await esm("client/streamableHttp.js");

const plan = JSON.parse(planText);
const transport = new StreamableHTTPClientTransport(new URL(plan.url), {
  requestInit: { headers: plan.headers ?? {} },
});
const client = new Client({ name: "egress-gateway-ts-test", version: "1" });
await client.connect(transport);
const tools = (await client.listTools()).tools;
const calls = [];
for (const call of plan.calls) {
  try {
    const params = { name: call.name, arguments: call.arguments };
    if (call.meta) params._meta = call.meta;
    calls.push({ ok: true, result: await client.callTool(params) });
  } catch (error) {
    calls.push({ ok: false, code: error.code ?? null, message: String(error.message ?? error) });
  }
}
await client.close();
process.stdout.write(JSON.stringify({ protocolVersion: transport.protocolVersion ?? null, tools, calls }) + "\n");
