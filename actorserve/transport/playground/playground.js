// actorserve playground: one EventSource per prompt on GET /v2/models/{model}/generate_stream,
// or, in chat mode, one streamed POST /v1/chat/completions per message (the OpenAI API), or,
// in raw mode, a JSON request of the user's own streamed from POST .../infer_stream.
// No build step, no dependencies; models.js (loaded first) reads what each model takes.
// In "continue" mode (in every mode; always on for a model whose every request needs a
// sequence) the first request sends sequence_start=true and reads the server-made
// sequence_id (from the events, or the sequence-id header of a POST's answer); later
// requests send that sequence_id, so the model continues from its state. A chat without
// "continue" resends the whole conversation.
"use strict";

const $ = (id) => document.getElementById(id);
const form = $("controls");
const modelSelect = $("model");
const promptBox = $("prompt");
const paramsBox = $("params");
const continueBox = $("continue");
const promptField = $("prompt-field");
const rawField = $("raw-field");
const rawBox = $("raw");
const rawHint = $("raw-hint");
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
let models = new Map(); // name -> what it takes (describeModel in models.js)
let rawModel = null; // the model whose template the raw editor holds, until edited

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
  const described = await Promise.all(
    names.map((name) => {
      const url = `/v2/models/${encodeURIComponent(name)}`;
      return Promise.all([getJSON(url).catch(() => null), getJSON(`${url}/config`).catch(() => null)]);
    }),
  );
  models = new Map(names.map((name, i) => [name, describeModel(name, ...described[i])]));
  modelSelect.replaceChildren();
  for (const model of models.values()) {
    // A model that takes no prompt is still served here: by a raw OIP request.
    modelSelect.add(new Option(model.prompt ? model.name : `${model.name} (raw OIP)`, model.name));
  }
  const preferred = names.includes("text") ? "text" : names[0];
  if (preferred) modelSelect.value = preferred;
  applyModel();
  modelSelect.dataset.ready = "true";
}

// Offer what the selected model takes: the modes it serves, its parameters' fields, and
// the prompt box or the raw request editor.
function applyModel() {
  const model = models.get(modelSelect.value);
  if (!model) return;
  const options = Object.fromEntries([...modeSelect.options].map((o) => [o.value, o]));
  options.generate.disabled = model.prompt === null;
  options.chat.disabled = !(model.text && model.text.chat);
  if (options[modeSelect.value].disabled) modeSelect.value = model.prompt === null ? "raw" : "generate";
  renderFields(paramsBox, model.fields);
  // A model that needs a sequence for every request always gets one (no box to untick).
  if (model.stateful) {
    continueBox.checked = true;
    continueBox.disabled = true;
  } else if (continueBox.disabled) {
    continueBox.disabled = false;
    continueBox.checked = false;
  }
  if (rawModel !== null || !rawBox.value) {
    rawBox.value = rawTemplate(model);
    rawModel = model.name;
  }
  rawHint.textContent = rawHintOf(model);
  applyMode();
}

function applyMode() {
  const mode = modeSelect.value;
  const raw = mode === "raw";
  promptField.hidden = raw;
  rawField.hidden = !raw;
  paramsBox.hidden = raw;
  for (const input of paramsBox.querySelectorAll("input[data-param]")) {
    input.closest("label").hidden = mode === "chat" && input.dataset.chat !== "true";
  }
  generateButton.textContent = raw ? "Send" : "Generate";
  document.body.dataset.mode = mode;
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

function textOf(data, name) {
  const value = data[name];
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
  const noun = modeSelect.value === "raw" ? "event" : "token";
  const parts = [`${run.events} ${noun}${run.events === 1 ? "" : "s"}`];
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
  const params = new URLSearchParams({ [model.prompt]: prompt });
  for (const [name, value] of Object.entries(readParameters(paramsBox))) params.set(name, String(value));
  if (continueBox.checked) {
    if (sequence) params.set("sequence_id", sequence.id);
    else params.set("sequence_start", "true");
  }
  return `/v2/models/${encodeURIComponent(model.name)}/generate_stream?${params}`;
}

function generate() {
  if (modeSelect.value === "chat") return chat();
  if (modeSelect.value === "raw") return sendRaw();
  if (source) return;
  const described = models.get(modelSelect.value);
  if (!described || described.prompt === null) return;
  const model = described.name;
  const prompt = promptBox.value;
  const url = streamURL(described, prompt);
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
    generated.appendData(textOf(data, described.output));
    counted();
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
  // The text-generation parameters under the OpenAI API's names (max_tokens for the one
  // that bounds the tokens, whatever the model calls it).
  const chosen = readParameters(paramsBox, true);
  const described = models.get(model);
  const maxTokens = described && described.text ? described.text.maxTokens : "max_tokens";
  const options = Object.fromEntries(Object.entries(chosen).map(([k, v]) => [k === maxTokens ? "max_tokens" : k, v]));
  const body = {
    model,
    messages: [{ role: "user", content }],
    ...options,
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
    await readEvents(answer, (event, data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const text = (chunk.choices[0] && chunk.choices[0].delta.content) || "";
      if (!text) return;
      reply += text;
      generated.appendData(text);
      counted();
    });
    generated.appendData("\n");
    if (!keep) history.push({ role: "user", content }, { role: "assistant", content: reply });
    if (source === request) finish("done");
  } catch (err) {
    if (source !== request) return; // stopped: the abort closed the stream on purpose
    showError(err.message);
    finish("error");
  }
}

// -- raw mode: the editor's JSON, POSTed to infer_stream, each event shown as it comes ------
// With "continue" the page puts the sequence parameters into the request's parameters
// (sequence_start on the first, then the sequence_id the answer names), as generate mode
// does, and shows each request above its events.

async function sendRaw() {
  if (source) return;
  const model = modelSelect.value;
  if (!model) return;
  let body;
  try {
    body = JSON.parse(rawBox.value);
  } catch (err) {
    showError(`the request is not JSON: ${err.message}`);
    return;
  }
  const keep = continueBox.checked;
  if (keep) {
    if (body === null || typeof body !== "object" || Array.isArray(body)) {
      showError("the request is not a JSON object");
      return;
    }
    const given = body.parameters;
    const parameters = given !== null && typeof given === "object" && !Array.isArray(given) ? { ...given } : {};
    delete parameters.sequence_id;
    delete parameters.sequence_start;
    if (sequence) parameters.sequence_id = sequence.id;
    else parameters.sequence_start = true;
    body = { ...body, parameters };
  }
  if (!keep || !sequence) output.replaceChildren();
  if (keep) {
    const sent = document.createElement("span");
    sent.className = "prompt";
    sent.textContent = `> ${requestSummary(body)}\n`;
    output.append(sent);
  }
  const events = document.createElement("span");
  events.className = "generated";
  output.append(events);
  showError("");
  run = { started: performance.now(), first: null, last: null, events: 0 };
  output.dataset.events = "0";
  statsLabel.textContent = "";
  const abort = new AbortController();
  const request = { close: () => abort.abort() };
  source = request;
  setState("streaming");
  try {
    const answer = await fetch(`/v2/models/${encodeURIComponent(model)}/infer_stream`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: abort.signal,
    });
    if (!answer.ok) {
      const error = await answer.json().catch(() => ({}));
      if (answer.status === 404 && sequence) forgetLocally(); // the sequence expired or ended
      throw new Error(`HTTP ${answer.status}: ${error.error || answer.statusText}`);
    }
    const id = answer.headers.get("sequence-id");
    if (keep && id !== null && sequence === null) {
      sequence = { id, model };
      showSequence();
    }
    await readEvents(answer, (event, data) => {
      if (event === "error") throw new Error(JSON.parse(data).error || data);
      events.append(`${data}\n`);
      counted();
    });
    if (source === request) finish("done");
  } catch (err) {
    if (source !== request) return; // stopped
    showError(err.message);
    finish("error");
  }
}

// One line for a raw request in a sequence's transcript: its inputs' names and data.
function requestSummary(body) {
  if (!Array.isArray(body.inputs)) return "request";
  return body.inputs.map((t) => `${t && t.name} ${JSON.stringify(t && t.data)}`).join(", ") || "no inputs";
}

// Call onEvent(event, data) for each server-sent event of a fetch answer's body.
async function readEvents(answer, onEvent) {
  const reader = answer.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let at;
    while ((at = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(event, data.join("\n"));
    }
  }
}

// One more piece of the running stream arrived.
function counted() {
  const now = performance.now();
  if (run.first === null) run.first = now;
  run.last = now;
  run.events += 1;
  scheduleStats();
  output.scrollTop = output.scrollHeight;
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
  applyModel();
});
modeSelect.addEventListener("change", () => {
  if (sequence) endSequence(); // a generate sequence is no chat, and the other way round
  history = [];
  output.replaceChildren();
  applyMode();
});
rawBox.addEventListener("input", () => {
  rawModel = null; // edited: keep it when the model changes
});
rawBox.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    generate();
  }
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
