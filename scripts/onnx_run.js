#!/usr/bin/env node
// Runs an ONNX file in ONNX Runtime (onnxruntime-node, CPU execution provider) on the tensors of a safetensors
// file and writes the outputs to another: the runtime side of the export tests (src/ampforge/cli/export_cli_test.cpp).
//   node scripts/onnx_run.js MODEL.onnx IN.safetensors OUT.safetensors
// Inputs are matched to the model's inputs by name ("images", "input_ids", ...). onnxruntime-node is looked up in
// $AMPFORGE_ONNXRUNTIME_NODE, then .deps/onnxruntime/node_modules (scripts/setup installs it there).
// safetensors layout: 8-byte little-endian header length, JSON header, data (https://github.com/huggingface/safetensors).
'use strict';
const fs = require('fs');
const path = require('path');

function loadOrt() {
  const candidates = [process.env.AMPFORGE_ONNXRUNTIME_NODE,
                      path.join(__dirname, '..', '.deps', 'onnxruntime', 'node_modules', 'onnxruntime-node')];
  for (const c of candidates) if (c && fs.existsSync(c)) return require(c);
  throw new Error('onnxruntime-node not found (run scripts/setup, or set AMPFORGE_ONNXRUNTIME_NODE)');
}

const kTypes = {  // safetensors dtype -> [onnxruntime type, typed array, bytes per element]
  F32: ['float32', Float32Array, 4], F16: ['float16', Uint16Array, 2], F64: ['float64', Float64Array, 8],
  I64: ['int64', BigInt64Array, 8], I32: ['int32', Int32Array, 4], U8: ['uint8', Uint8Array, 1],
  BOOL: ['bool', Uint8Array, 1],
};

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const data = buf.subarray(8 + n);
  const out = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [type, Arr, size] = kTypes[info.dtype] || [];
    if (!type) throw new Error(`${file}: tensor ${name} has unsupported dtype ${info.dtype}`);
    const [b, e] = info.data_offsets;
    const bytes = Uint8Array.prototype.slice.call(data, b, e);  // a copy, aligned for the typed array
    out[name] = {type, dims: info.shape, data: new Arr(bytes.buffer, 0, (e - b) / size)};
  }
  return out;
}

function writeSafetensors(file, tensors) {
  const names = {float32: 'F32', float16: 'F16', float64: 'F64', int64: 'I64', int32: 'I32', uint8: 'U8', bool: 'BOOL'};
  const header = {};
  const chunks = [];
  let off = 0;
  for (const [name, t] of Object.entries(tensors)) {
    const bytes = Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    header[name] = {dtype: names[t.type], shape: t.dims, data_offsets: [off, off + bytes.length]};
    chunks.push(bytes);
    off += bytes.length;
  }
  let h = Buffer.from(JSON.stringify(header), 'utf8');
  const pad = (8 - (h.length % 8)) % 8;
  h = Buffer.concat([h, Buffer.alloc(pad, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  fs.writeFileSync(file, Buffer.concat([len, h, ...chunks]));
}

async function main() {
  const [model, input, output] = process.argv.slice(2);
  if (!output) {
    console.error('usage: onnx_run.js MODEL.onnx IN.safetensors OUT.safetensors');
    process.exit(2);
  }
  const ort = loadOrt();
  const session = await ort.InferenceSession.create(model, {intraOpNumThreads: 2, interOpNumThreads: 1});
  const inputs = readSafetensors(input);
  const feeds = {};
  for (const name of session.inputNames) {
    const t = inputs[name];
    if (!t) throw new Error(`${input} has no tensor '${name}' (model inputs: ${session.inputNames.join(', ')})`);
    feeds[name] = new ort.Tensor(t.type, t.data, t.dims);
  }
  const t0 = process.hrtime.bigint();
  const results = await session.run(feeds);
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  const out = {};
  for (const name of session.outputNames) {
    const r = results[name];
    out[name] = {type: r.type, dims: Array.from(r.dims), data: r.data};
  }
  writeSafetensors(output, out);
  console.log(JSON.stringify({runtime: 'onnxruntime-node', version: ort.env.versions ? ort.env.versions.common : '',
                              outputs: Object.fromEntries(Object.entries(out).map(([k, v]) => [k, v.dims])), ms}));
}

main().catch((e) => {
  console.error(`onnx_run.js: ${e.message}`);
  process.exit(1);
});
