// What the Agents SDK scripts share: every server event checked against the SDK's own zod schema (the SDK would
// drop one it rejects silently), its errors kept in the report, and the wait for an answer spoken after a tool.
// Not exported by the package: the schema its transport parses every server event with.
import { realtimeServerEventSchema } from './node_modules/@openai/agents-realtime/dist/openaiRealtimeEvents.mjs';

const known = new Set(realtimeServerEventSchema.options.map((s) => s.shape.type.value));

export function watch(session, report) {
  session.transport.on('*', (event) => {
    const parsed = realtimeServerEventSchema.safeParse(event);
    if (!parsed.success && known.has(event.type)) {
      report.invalid.push({ type: event.type, issues: parsed.error.issues });
    }
  });
  session.on('error', (event) => report.errors.push(String(event.error?.error?.message ?? event.error)));
}

// Resolves at the first end of playback once `heard()` holds (audio after the tool came); rejects after `ms`.
export function spokenAfter(session, heard, what, ms) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no spoken answer after ${what} within ${ms / 1000} s`)), ms);
    session.on('audio_stopped', () => {
      if (heard()) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}
