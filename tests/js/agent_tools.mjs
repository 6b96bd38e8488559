// The JS Agents SDK (@openai/agents-realtime, unmodified, Node WebSocket transport) with a tool() against
// the gateway: asks for the weather and waits until the answer after the tool has been spoken.
// Usage: node agent_tools.mjs <ws://.../v1/realtime?model=...> <tool|handoff>
// Prints one JSON report: the tool's calls and results, handoffs, the audio after the tool, the SDK's
// errors, and every server event the SDK's own zod schema knows but rejects (it would drop those silently).
import { RealtimeAgent, RealtimeSession, tool } from '@openai/agents-realtime';
import { z } from 'zod';
import { spokenAfter, watch } from './agent_session.mjs';

const [url, scenario] = process.argv.slice(2);
const report = { calls: [], toolResults: [], handoffs: [], audioBytesAfterTool: 0, errors: [], invalid: [] };

const getWeather = tool({
  name: 'get_weather',
  description: 'The weather in a city.',
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    report.calls.push(city);
    return `sunny and 21 degrees in ${city}`;
  },
});
const weather = new RealtimeAgent({ name: 'Weather agent', instructions: 'You tell the weather.', tools: [getWeather] });
const greeter = new RealtimeAgent({ name: 'Greeter', instructions: 'You greet, then hand over.', handoffs: [weather] });

const session = new RealtimeSession(scenario === 'handoff' ? greeter : weather, { transport: 'websocket' });
watch(session, report);
session.on('agent_handoff', (_ctx, from, to) => report.handoffs.push([from.name, to.name]));
session.on('agent_tool_end', (_ctx, _agent, t, result) => report.toolResults.push([t.name, result]));
session.on('audio', (event) => {
  if (report.toolResults.length) report.audioBytesAfterTool += event.data.byteLength;
});

const spoken = spokenAfter(session, () => report.audioBytesAfterTool > 0, 'the tool', 15000);
await session.connect({ apiKey: 'unused', url });
session.sendMessage('What is the weather in Paris?');
try {
  await spoken;
} finally {
  session.close();
  console.log(JSON.stringify(report));
}
