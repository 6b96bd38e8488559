// The JS Agents SDK (@openai/agents-realtime, unmodified, Node WebSocket transport) with a hosted MCP tool: the
// gateway lists and calls the server's tools. Asks for the weather and waits until the answer after the call has
// been spoken, then a second more for anything that follows.
// Usage: node agent_mcp.mjs <ws://.../v1/realtime?model=...> <mcp server URL> <never|always>
// With "always" each approval request is approved with session.approve(), as the SDK's docs show.
// Prints one JSON report: each response.done's output types, the calls completed, the approvals asked, the audio
// after the call, the SDK's errors, and every server event the SDK's own zod schema knows but rejects.
import { hostedMcpTool } from '@openai/agents-core';
import { RealtimeAgent, RealtimeSession } from '@openai/agents-realtime';
import { spokenAfter, watch } from './agent_session.mjs';

const [url, serverUrl, approval] = process.argv.slice(2);
const report = { responses: [], completed: [], approvals: [], audioBytesAfterCall: 0, errors: [], invalid: [] };

const weather = hostedMcpTool({ serverLabel: 'weather', serverUrl, requireApproval: approval });
const agent = new RealtimeAgent({ name: 'Weather agent', instructions: 'You tell the weather.', tools: [weather] });
const session = new RealtimeSession(agent, { transport: 'websocket' });
watch(session, report);
session.transport.on('*', (event) => {
  if (event.type === 'response.done') report.responses.push(event.response.output.map((o) => o.type));
});
session.on('mcp_tool_call_completed', (_ctx, _agent, call) => report.completed.push([call.name, call.output]));
session.on('tool_approval_requested', async (_ctx, _agent, request) => {
  report.approvals.push(request.approvalItem.rawItem.name);
  await session.approve(request.approvalItem);
});
session.on('audio', (event) => {
  if (report.completed.length) report.audioBytesAfterCall += event.data.byteLength;
});

const spoken = spokenAfter(session, () => report.audioBytesAfterCall > 0, 'the MCP call', 20000);
await session.connect({ apiKey: 'unused', url });
session.sendMessage('What is the weather in Paris?');
try {
  await spoken;
  await new Promise((resolve) => setTimeout(resolve, 1000));
} finally {
  session.close();
  console.log(JSON.stringify(report));
}
