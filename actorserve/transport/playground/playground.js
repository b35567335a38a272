// actorserve playground: one EventSource per prompt on GET /v2/models/{model}/generate_stream,
// or, in chat mode, one streamed POST /v1/chat/completions per message (the OpenAI API).
// No build step, no dependencies. In "continue" mode the first request sends
// sequence_start=true and reads the server-made sequence_id (from the events, or the
// sequence-id header in chat mode); later requests send that sequence_id, so the model
// continues from its state. A chat without "continue" resends the whole conversation.
"use strict";

const $ = (id) => document.getElementById(id);
const form = $("controls");
const modelSelect = $("model");
const promptBox = $("prompt");
const maxTokensBox = $("max-tokens");
const temperatureBox = $("temperature");
const continueBox = $("continue");
const modeSelect = $("mode");
const generateButton = $("generate");
const stopButton = $("stop");
const forgetButton = $("forget");
const clearButton = $("clear");
const output = $("output");
const stateLabel = $("state");
const statsLabel = $("stats");
const sequenceLabel = $("sequence");
const sequenceIdLabel = $("sequence-id");
const errorBox = $("error");

let source = null; // the running request: its EventSource, or {close} aborting a chat fetch
let history = []; // the conversation so far, in chat mode without a sequence
let sequence = null; // {id, model} of the open sequence, in continue mode
let run = null; // counters of the running request
let statsPending = false;

// -- models -----------------------------------------------------------------------------

async function getJSON(url) {
  const reply = await fetch(url);
  if (!reply.ok) throw new Error(`${url}: HTTP ${reply.status}`);
  return reply.json();
}

async function loadModels() {
  let names;
  try {
    const index = await getJSON("/v2/repository/index");
    names = [...new Set(index.filter((m) => m.state === "READY").map((m) => m.name))];
  } catch (err) {
    names = ["text", "streamer"]; // the built-in text models
    showError(`could not list the models (${err.message}); showing the built-ins`);
  }
  // A model is usable here if it takes a text_input (or declares no inputs at all).
  const metadata = await Promise.all(
    names.map((name) => getJSON(`/v2/models/${encodeURIComponent(name)}`).catch(() => null)),
  );
  modelSelect.replaceChildren();
  names.forEach((name, i) => {
    const inputs = (metadata[i] && metadata[i].inputs) || [];
    const usable = inputs.length === 0 || inputs.some((t) => t.name === "text_input");
    const option = new Option(usable ? name : `${name} (no text_input)`, name);
    option.disabled = !usable;
    modelSelect.add(option);
  });
  const preferred = names.includes("text") ? "text" : [...modelSelect.options].find((o) => !o.disabled)?.value;
  if (preferred) modelSelect.value = preferred;
  modelSelect.dataset.ready = "true";
}

// -- output -----------------------------------------------------------------------------

function setState(state) {
  stateLabel.textContent = state;
  stateLabel.dataset.state = state;
  output.dataset.state = state;
  const streaming = state === "streaming";
  generateButton.disabled = streaming;
  stopButton.disabled = !streaming;
  forgetButton.disabled = streaming || sequence === null;
  modelSelect.disabled = streaming;
  modeSelect.disabled = streaming;
}

function showError(message) {
  errorBox.textContent = message;
  errorBox.hidden = !message;
}

function showSequence() {
  sequenceLabel.hidden = sequence === null;
  sequenceIdLabel.textContent = sequence ? sequence.id : "";
  forgetButton.disabled = sequence === null || source !== null;
}

function textOf(data) {
  const value = data.text_output;
  if (typeof value === "string") return value;
  if (Array.isArray(value)) return value.flat(Infinity).join("");
  const rest = Object.fromEntries(
    Object.entries(data).filter(([k]) => !["id", "model_name", "model_version", "sequence_id"].includes(k)),
  );
  return JSON.stringify(rest) + "\n";
}

function updateStats() {
  statsPending = false;
  if (!run) return;
  const parts = [`${run.events} token${run.events === 1 ? "" : "s"}`];
  if (run.first !== null) {
    const seconds = (run.last - run.first) / 1000;
    if (run.events > 1 && seconds > 0) parts.push(`${Math.round((run.events - 1) / seconds)} tok/s`);
    parts.push(`first token ${Math.round(run.first - run.started)} ms`);
  }
  statsLabel.textContent = parts.join(" · ");
  output.dataset.events = String(run.events);
}

function scheduleStats() {
  if (!statsPending) {
    statsPending = true;
    requestAnimationFrame(updateStats);
  }
}

// -- a request --------------------------------------------------------------------------

function streamURL(model, prompt) {
  const params = new URLSearchParams({
    text_input: prompt,
    max_tokens: String(maxTokensBox.valueAsNumber),
    temperature: String(temperatureBox.valueAsNumber),
  });
  if (continueBox.checked) {
    if (sequence) params.set("sequence_id", sequence.id);
    else params.set("sequence_start", "true");
  }
  return `/v2/models/${encodeURIComponent(model)}/generate_stream?${params}`;
}

function generate() {
  if (modeSelect.value === "chat") return chat();
  if (source) return;
  const model = modelSelect.value;
  if (!model) return;
  const prompt = promptBox.value;
  const url = streamURL(model, prompt);
  const keep = continueBox.checked;
  if (!keep || !sequence) output.replaceChildren();
  const promptSpan = document.createElement("span");
  promptSpan.className = "prompt";
  promptSpan.textContent = prompt;
  const generated = document.createTextNode("");
  const generatedSpan = document.createElement("span");
  generatedSpan.className = "generated";
  generatedSpan.append(generated);
  output.append(promptSpan, generatedSpan);
  showError("");
  run = { started: performance.now(), first: null, last: null, events: 0 };
  output.dataset.events = "0";
  statsLabel.textContent = "";

  if (keep) promptBox.value = ""; // the sequence remembers it: type only what comes next
  source = new EventSource(url);
  setState("streaming");
  source.onmessage = (event) => {
    const data = JSON.parse(event.data);
    if (keep && data.sequence_id !== undefined && sequence === null) {
      sequence = { id: String(data.sequence_id), model };
      showSequence();
    }
    generated.appendData(textOf(data));
    const now = performance.now();
    if (run.first === null) run.first = now;
    run.last = now;
    run.events += 1;
    scheduleStats();
    output.scrollTop = output.scrollHeight;
  };
  source.addEventListener("end", () => finish("done"));
  // Both the server's "event: error" (with data) and a failed connection land here.
  source.addEventListener("error", (event) => {
    if (!source) return;
    if (event.data) {
      const error = JSON.parse(event.data);
      if (error.status === 404 && sequence) forgetLocally(); // the sequence expired or ended
      showError(error.error || event.data);
      finish("error");
    } else {
      const nothing = run.events === 0;
      finish("error");
      if (nothing) explainFailure(url);
      else showError("the connection was lost");
    }
  });
}

// -- chat mode: POST /v1/chat/completions, its SSE body read with fetch ---------------------

function chatBody(model, content) {
  const body = {
    model,
    messages: [{ role: "user", content }],
    max_tokens: maxTokensBox.valueAsNumber,
    temperature: temperatureBox.valueAsNumber,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (continueBox.checked) {
    if (sequence) body.sequence_id = sequence.id;
    else body.sequence_start = true;
  } else {
    body.messages = [...history, ...body.messages];
  }
  return body;
}

async function chat() {
  if (source) return;
  const model = modelSelect.value;
  if (!model) return;
  const content = promptBox.value;
  const keep = continueBox.checked;
  const body = chatBody(model, content);
  if (!keep && history.length === 0) output.replaceChildren();
  if (keep && !sequence) output.replaceChildren();
  const promptSpan = document.createElement("span");
  promptSpan.className = "prompt";
  promptSpan.textContent = `user: ${content}\n`;
  const generated = document.createTextNode("");
  const generatedSpan = document.createElement("span");
  generatedSpan.className = "generated";
  generatedSpan.append(generated);
  output.append(promptSpan, document.createTextNode("assistant: "), generatedSpan);
  showError("");
  run = { started: performance.now(), first: null, last: null, events: 0 };
  output.dataset.events = "0";
  statsLabel.textContent = "";
  promptBox.value = "";
  const abort = new AbortController();
  const request = { close: () => abort.abort() };
  source = request;
  setState("streaming");
  let reply = "";
  try {
    const answer = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: abort.signal,
    });
    if (!answer.ok) {
      const error = await answer.json().catch(() => ({}));
      if (answer.status === 404 && sequence) forgetLocally();
      throw new Error(`HTTP ${answer.status}: ${(error.error && error.error.message) || answer.statusText}`);
    }
    const id = answer.headers.get("sequence-id");
    if (keep && id !== null && sequence === null) {
      sequence = { id, model };
      showSequence();
    }
    const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let at;
      while ((at = buffer.indexOf("\n\n")) >= 0) {
        const data = buffer.slice(0, at).replace(/^data: /, "");
        buffer = buffer.slice(at + 2);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const text = (chunk.choices[0] && chunk.choices[0].delta.content) || "";
        if (!text) continue;
        reply += text;
        generated.appendData(text);
        const now = performance.now();
        if (run.first === null) run.first = now;
        run.last = now;
        run.events += 1;
        scheduleStats();
        output.scrollTop = output.scrollHeight;
      }
    }
    generated.appendData("\n");
    if (!keep) history.push({ role: "user", content }, { role: "assistant", content: reply });
    if (source === request) finish("done");
  } catch (err) {
    if (source !== request) return; // stopped: the abort closed the stream on purpose
    showError(err.message);
    finish("error");
  }
}

// EventSource hides the status and body of a refused request: ask again with fetch to
// show the server's {"error": ...} message (a refused request did no work).
async function explainFailure(url) {
  const abort = new AbortController();
  try {
    const reply = await fetch(url, { signal: abort.signal });
    if (!reply.ok) {
      const body = await reply.json().catch(() => ({}));
      if (reply.status === 404 && sequence) forgetLocally();
      showError(`HTTP ${reply.status}: ${body.error || reply.statusText}`);
    } else {
      showError("the stream failed; try again");
    }
  } catch (err) {
    showError(`cannot reach the server (${err.message})`);
  } finally {
    abort.abort();
  }
}

function finish(state) {
  if (source) source.close();
  source = null;
  updateStats();
  setState(state);
}

function stop() {
  if (source) finish("stopped"); // closing the stream cancels the request on the server
}

// -- sequences --------------------------------------------------------------------------

function forgetLocally() {
  sequence = null;
  showSequence();
}

async function endSequence() {
  if (!sequence) return;
  const { id, model } = sequence;
  forgetLocally();
  const body = { inputs: [], parameters: { sequence_id: id, sequence_cancel: true } };
  try {
    await fetch(`/v2/models/${encodeURIComponent(model)}/infer`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    document.body.dataset.endedSequence = id;
  } catch (err) {
    showError(`could not end sequence ${id}: ${err.message}`);
  }
  setState(stateLabel.dataset.state);
}

// -- wiring -----------------------------------------------------------------------------

form.addEventListener("submit", (event) => {
  event.preventDefault();
  generate();
});
promptBox.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    generate();
  }
});
stopButton.addEventListener("click", stop);
forgetButton.addEventListener("click", endSequence);
clearButton.addEventListener("click", () => {
  if (source) stop();
  history = [];
  output.replaceChildren();
  statsLabel.textContent = "";
  showError("");
});
continueBox.addEventListener("change", () => {
  if (!continueBox.checked) endSequence();
});
modelSelect.addEventListener("change", () => {
  if (sequence && sequence.model !== modelSelect.value) endSequence();
  history = [];
});
modeSelect.addEventListener("change", () => {
  if (sequence) endSequence(); // a generate sequence is no chat, and the other way round
  history = [];
  output.replaceChildren();
});
window.addEventListener("beforeunload", () => {
  if (sequence) {
    const body = { inputs: [], parameters: { sequence_id: sequence.id, sequence_cancel: true } };
    navigator.sendBeacon(
      `/v2/models/${encodeURIComponent(sequence.model)}/infer`,
      new Blob([JSON.stringify(body)], { type: "application/json" }),
    );
  }
});

setState("idle");
loadModels();
