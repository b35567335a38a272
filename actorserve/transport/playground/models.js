// actorserve playground: what each model takes, read from its metadata (GET /v2/models/{m}):
// its inputs, the request parameters it declares (parameters.request_parameters) and its
// text-generation declaration (parameters["text_generation.*"]); see docs/rest.md.
// From these come the prompt box (text models only), one typed field per declared
// parameter (so a request never carries a parameter the model would refuse) and a
// template of a raw OIP request for any model. Loaded before playground.js.
"use strict";

const DEFAULT_MAX_TOKENS = "200";
const DEFAULT_TEMPERATURE = "0.8";

const namesOf = (value) => (typeof value === "string" && value ? value.split(",") : []);

// One model's declarations from its metadata (null metadata: unknown, nothing declared)
// and Triton's configuration of it (GET /v2/models/{m}/config), whose sequence_batching
// says every request needs a sequence.
function describeModel(name, metadata, config) {
  const meta = metadata || {};
  const declared = meta.parameters || {};
  const inputs = meta.inputs || [];
  const text = "text_generation.input" in declared
    ? {
        input: declared["text_generation.input"],
        output: declared["text_generation.output"],
        maxTokens: declared["text_generation.max_tokens"],
        sampling: namesOf(declared["text_generation.sampling"]),
        usage: declared["text_generation.usage"] === true,
        chat: declared["text_generation.chat"] === true,
      }
    : null;
  // Without a declaration, a model that takes a BYTES text_input still takes a prompt.
  const takesText = inputs.some((t) => t.name === "text_input" && t.datatype === "BYTES");
  const parameters = "request_parameters" in declared ? namesOf(declared.request_parameters) : null;
  return {
    name,
    inputs,
    text,
    prompt: text ? text.input : takesText ? "text_input" : null,
    output: text ? text.output : "text_output",
    parameters, // null: the model takes any parameter
    fields: parameterFields(parameters, text),
    stateful: Boolean(config && config.sequence_batching), // a sequence for every request
  };
}

// The fields of a model's parameters: the declared ones, or (when it declares none) the
// ones its text-generation declaration names. Types come from that declaration and the
// sampling options' known meaning; any other parameter is a free field whose value is
// read like a JSON scalar (as GET generate_stream reads it).
function parameterFields(declared, text) {
  const textNames = text ? [text.maxTokens, ...text.sampling] : [];
  const names = declared === null ? textNames : [...textNames.filter((n) => declared.includes(n)),
    ...[...declared].sort().filter((n) => !textNames.includes(n))];
  return names.map((name) => {
    const chat = textNames.includes(name); // the OpenAI API takes it too
    if (text && name === text.maxTokens) {
      return { name, id: "max-tokens", kind: "integer", min: 0, step: 1, value: DEFAULT_MAX_TOKENS, chat };
    }
    if (name === "temperature") return { name, id: "temperature", kind: "number", min: 0, max: 5, step: 0.05, value: DEFAULT_TEMPERATURE, chat };
    if (name === "top_p") return { name, id: "param-top_p", kind: "number", min: 0, max: 1, step: 0.05, value: "", chat };
    if (name === "seed") return { name, id: "param-seed", kind: "integer", step: 1, value: "", chat };
    if (name === "usage" && text && text.usage) return { name, id: "param-usage", kind: "boolean", chat: false };
    return { name, id: `param-${name}`, kind: "scalar", value: "", chat: false };
  });
}

// Put the fields into `container`, keeping what the user typed into fields of the same id.
function renderFields(container, fields) {
  const kept = new Map([...container.querySelectorAll("input")].map((i) => [i.id, i.type === "checkbox" ? i.checked : i.value]));
  container.replaceChildren();
  for (const field of fields) {
    const label = document.createElement("label");
    label.className = field.kind === "boolean" ? "check param" : "field param";
    const name = document.createElement("span");
    name.textContent = field.name;
    const input = document.createElement("input");
    input.id = field.id;
    input.name = field.name;
    input.dataset.param = field.name;
    input.dataset.kind = field.kind;
    input.dataset.chat = String(field.chat);
    if (field.kind === "boolean") {
      input.type = "checkbox";
      input.checked = kept.get(field.id) === true;
      label.append(input, name);
    } else {
      input.type = field.kind === "scalar" ? "text" : "number";
      for (const key of ["min", "max", "step"]) if (field[key] !== undefined) input[key] = String(field[key]);
      input.value = kept.has(field.id) ? kept.get(field.id) : field.value;
      if (field.kind === "scalar") input.placeholder = "not sent";
      label.append(name, input);
    }
    container.append(label);
  }
}

// The parameters the fields say, by name; an empty field (or an unchecked box) is not sent.
function readParameters(container, chatOnly = false) {
  const parameters = {};
  for (const input of container.querySelectorAll("input[data-param]")) {
    if (chatOnly && input.dataset.chat !== "true") continue;
    const kind = input.dataset.kind;
    if (kind === "boolean") {
      if (input.checked) parameters[input.dataset.param] = true;
    } else if (kind === "scalar") {
      if (input.value !== "") parameters[input.dataset.param] = scalar(input.value);
    } else if (!Number.isNaN(input.valueAsNumber)) {
      parameters[input.dataset.param] = input.valueAsNumber;
    }
  }
  return parameters;
}

function scalar(text) {
  try {
    const value = JSON.parse(text);
    if (["number", "boolean"].includes(typeof value)) return value;
  } catch (err) {
    // not a number or a boolean: it is sent as the text typed
  }
  return text;
}

// A raw OIP request for `model` to start from: each declared input with a value of its
// datatype (the prompt input says "Hello"), sizes of -1 taken as 1, no parameters.
function rawTemplate(model) {
  const inputs = model.inputs.map((t) => {
    const shape = (t.shape || [1]).map((d) => (d < 0 ? 1 : d));
    const count = shape.reduce((a, b) => a * b, 1);
    const datatype = t.datatype || "BYTES";
    const value = datatype === "BYTES" ? (t.name === model.prompt ? "Hello" : "") : datatype === "BOOL" ? false : 0;
    return { name: t.name, datatype, shape, data: Array(count).fill(value) };
  });
  // One line per input: the data is what a user edits.
  const lines = inputs.map((t) => `    ${JSON.stringify(t)}`);
  return `{\n  "inputs": [\n${lines.join(",\n")}\n  ],\n  "parameters": {}\n}`;
}

function rawHintOf(model) {
  const sequence = model.stateful
    ? " Every request needs a sequence: the page opens one, sends its id with each request and ends it on End sequence."
    : "";
  if (model.parameters === null) return `This model declares no parameters: any parameter is passed on.${sequence}`;
  if (model.parameters.length === 0) return `This model reads no request parameters (sequence ones aside).${sequence}`;
  return `Parameters this model reads: ${model.parameters.join(", ")}.${sequence}`;
}
