#!/usr/bin/env node
// A chunkserve session producer written from docs/asyncapi.json alone.
//
// It opens a few sessions, pushes inputs (seq from 1), sends each session idle and active,
// pushes more inputs, waits until every input is accepted (worker-events), closes the
// sessions and waits until their owners release them. It reads worker-events and
// dead-letters from the beginning with a consumer group of its own, so it may start before
// or after the fleet. Exit 0 when every input was accepted and every session released as
// closed; 1 when an input was refused (dead-letters) or the time ran out; 2 on bad usage.
//
// Everything it needs from chunkserve is read from the contract at start: channel addresses,
// type tags (`t`), schema versions (`v`), the `cs-t` header, and each payload's schema, which
// every record is checked against before it is sent.
//
//   node producer.js --bootstrap 127.0.0.1:9092 [--prefix chunkserve.] [--sessions 3]
//                    [--inputs 4] [--timeout-s 60] [--contract ../../docs/asyncapi.json]

'use strict'

const fs = require('fs')
const path = require('path')
const crypto = require('crypto')
const { Kafka, Partitioners, logLevel } = require('kafkajs')
const { encode, decode } = require('@msgpack/msgpack')

function parseArgs (argv) {
  const opts = {
    bootstrap: process.env.CHUNKSERVE_KAFKA_BOOTSTRAP || '',
    prefix: process.env.CHUNKSERVE_TOPIC_PREFIX || null,
    sessions: 3,
    inputs: 4,
    timeoutS: 60,
    contract: path.join(__dirname, '..', '..', 'docs', 'asyncapi.json')
  }
  const names = { '--bootstrap': 'bootstrap', '--prefix': 'prefix', '--sessions': 'sessions',
    '--inputs': 'inputs', '--timeout-s': 'timeoutS', '--contract': 'contract' }
  for (let i = 0; i < argv.length; i += 2) {
    const name = names[argv[i]]
    if (!name || argv[i + 1] === undefined) usage(`unknown or incomplete option ${argv[i]}`)
    opts[name] = typeof opts[name] === 'number' ? Number(argv[i + 1]) : argv[i + 1]
  }
  if (!opts.bootstrap) usage('no broker: --bootstrap or CHUNKSERVE_KAFKA_BOOTSTRAP')
  for (const n of ['sessions', 'inputs', 'timeoutS']) {
    if (!(opts[n] >= 1)) usage(`--${n}: a positive number`)
  }
  return opts
}

// TLS and SASL from the same environment variables chunkserve reads (the contract's
// cluster-sasl-ssl server): the security protocol, the CA that signed the broker's
// certificate, and the mechanism, user name and password
function security (env) {
  const protocol = env.CHUNKSERVE_KAFKA_SECURITY_PROTOCOL || 'PLAINTEXT'
  if (!['PLAINTEXT', 'SSL', 'SASL_PLAINTEXT', 'SASL_SSL'].includes(protocol)) {
    usage(`CHUNKSERVE_KAFKA_SECURITY_PROTOCOL: ${protocol} is none of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL`)
  }
  const out = {}
  if (protocol.endsWith('SSL')) {
    out.ssl = env.CHUNKSERVE_KAFKA_SSL_CAFILE ? { ca: [fs.readFileSync(env.CHUNKSERVE_KAFKA_SSL_CAFILE, 'utf8')] } : true
  }
  if (protocol.startsWith('SASL')) {
    const mechanism = (env.CHUNKSERVE_KAFKA_SASL_MECHANISM || 'PLAIN').toLowerCase()
    if (!['plain', 'scram-sha-256', 'scram-sha-512'].includes(mechanism)) {
      usage(`CHUNKSERVE_KAFKA_SASL_MECHANISM: ${mechanism} is none of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512`)
    }
    const username = env.CHUNKSERVE_KAFKA_SASL_USERNAME
    const password = env.CHUNKSERVE_KAFKA_SASL_PASSWORD
    if (!username || !password) usage(`${protocol} needs CHUNKSERVE_KAFKA_SASL_USERNAME and CHUNKSERVE_KAFKA_SASL_PASSWORD`)
    out.sasl = { mechanism, username, password }
  }
  return out
}

function usage (why) {
  process.stderr.write(`node-producer: ${why}\n`)
  process.exit(2)
}

// ---- the contract -----------------------------------------------------------------------

class Contract {
  constructor (file, prefix) {
    this.doc = JSON.parse(fs.readFileSync(file, 'utf8'))
    this.channelOf = {} // message title -> channel
    for (const channel of Object.values(this.doc.channels)) {
      for (const ref of Object.values(channel.messages)) {
        this.channelOf[ref.$ref.split('/').pop()] = channel
      }
    }
    // the document's {prefix} parameter: its default unless the deployment sets another
    const any = Object.values(this.doc.channels)[0]
    this.prefix = prefix === null ? any.parameters.prefix.default : prefix
  }

  message (title) {
    const message = this.doc.components.messages[title]
    if (!message) throw new Error(`the contract has no message ${title}`)
    return message
  }

  topic (title) {
    return this.channelOf[title].address.replace('{prefix}', this.prefix)
  }

  tag (title) {
    return this.message(title).payload.properties.t.const
  }

  // a record of message `title`: its tag, the newest schema version the document allows,
  // and `fields`; checked against the payload schema before it goes anywhere
  record (title, fields) {
    const props = this.message(title).payload.properties
    const value = { t: props.t.const, v: props.v.maximum, ...fields }
    check(this.resolve(this.message(title).payload), value, title, this)
    return value
  }

  headers (title) {
    const out = {}
    const props = (this.message(title).headers || {}).properties || {}
    for (const [name, spec] of Object.entries(props)) {
      if ('const' in spec) out[name] = String(spec.const)
    }
    return out
  }

  resolve (schema) {
    if (!schema.$ref) return schema
    return schema.$ref.replace(/^#\//, '').split('/').reduce((node, key) => node[key], this.doc)
  }
}

// the part of JSON Schema the document uses
function check (schema, value, where, contract) {
  schema = contract.resolve(schema)
  if (schema.oneOf) {
    const errors = []
    for (const option of schema.oneOf) {
      try { return check(option, value, where, contract) } catch (e) { errors.push(e.message) }
    }
    throw new Error(`${where}: matches none of ${errors.join('; ')}`)
  }
  const is = {
    string: v => typeof v === 'string',
    integer: v => Number.isInteger(v),
    number: v => typeof v === 'number' && Number.isFinite(v),
    boolean: v => typeof v === 'boolean',
    object: v => v !== null && typeof v === 'object' && !Array.isArray(v),
    array: v => Array.isArray(v),
    null: v => v === null
  }
  if (schema.type && !is[schema.type](value)) throw new Error(`${where}: not a ${schema.type}: ${value}`)
  if ('const' in schema && value !== schema.const) throw new Error(`${where}: must be ${schema.const}`)
  if (schema.enum && !schema.enum.includes(value)) throw new Error(`${where}: not one of ${schema.enum}`)
  if ('minimum' in schema && value < schema.minimum) throw new Error(`${where}: below ${schema.minimum}`)
  if ('maximum' in schema && value > schema.maximum) throw new Error(`${where}: above ${schema.maximum}`)
  if (typeof value === 'string') {
    const n = [...value].length
    if ('minLength' in schema && n < schema.minLength) throw new Error(`${where}: too short`)
    if ('maxLength' in schema && n > schema.maxLength) throw new Error(`${where}: too long`)
  }
  if (schema.type === 'object') {
    for (const name of schema.required || []) {
      if (!(name in value)) throw new Error(`${where}: missing ${name}`)
    }
    for (const [name, item] of Object.entries(value)) {
      const spec = (schema.properties || {})[name]
      if (spec) check(spec, item, `${where}.${name}`, contract)
      else if (schema.additionalProperties === false) throw new Error(`${where}: unexpected ${name}`)
    }
  }
}

// ---- what the fleet says back -------------------------------------------------------------

class Ledger {
  constructor (contract, sessions) {
    this.sessions = new Set(sessions)
    this.tags = {}
    for (const title of ['InputAccepted', 'Released', 'Claimed', 'DeadLetter', 'InputPushed']) {
      this.tags[contract.tag(title)] = title
    }
    this.accepted = new Set() // "sid\0seq"
    this.closed = new Set()
    this.claimed = new Set()
    this.refused = [] // {session_id, seq, reason}
  }

  take (value) {
    let record
    try { record = decode(value) } catch (e) { return } // not ours to judge
    if (record === null || typeof record !== 'object') return
    const title = this.tags[record.t]
    if (title === 'DeadLetter') return this.deadLetter(record)
    if (!this.sessions.has(record.session_id)) return
    if (title === 'InputAccepted') this.accepted.add(`${record.session_id}\0${record.seq}`)
    else if (title === 'Claimed') this.claimed.add(record.session_id)
    else if (title === 'Released' && record.reason === 'closed') this.closed.add(record.session_id)
  }

  // a refused input: its raw bytes are the InputPushed that was sent
  deadLetter (record) {
    if (!(record.raw instanceof Uint8Array)) return
    let refused
    try { refused = decode(record.raw) } catch (e) { return }
    if (refused && this.tags[refused.t] === 'InputPushed' && this.sessions.has(refused.session_id)) {
      this.refused.push({ session_id: refused.session_id, seq: refused.seq, reason: record.reason })
    }
  }
}

// ---- the run ------------------------------------------------------------------------------

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))

async function until (test, deadline, what) {
  while (!test()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(100)
  }
}

async function main () {
  const opts = parseArgs(process.argv.slice(2))
  const contract = new Contract(opts.contract, opts.prefix)
  const run = crypto.randomBytes(4).toString('hex')
  const sessions = Array.from({ length: opts.sessions }, (_, i) => `node-${run}-${i}`)
  const ledger = new Ledger(contract, sessions)
  const deadline = Date.now() + opts.timeoutS * 1000
  const log = msg => process.stderr.write(`node-producer: ${msg}\n`)

  const kafka = new Kafka({ clientId: 'node-producer', brokers: opts.bootstrap.split(','), logLevel: logLevel.WARN,
    ...security(process.env) })
  // keyed records go where the contract says: murmur2 of the key modulo the partition count,
  // which is kafkajs' DefaultPartitioner; one in-flight request keeps a session's order
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner,
    allowAutoTopicCreation: false, idempotent: true, maxInFlightRequests: 1 })
  // a group of its own per run, named as the client role's ACLs allow (`chunkserve acls --role client`)
  const consumer = kafka.consumer({ groupId: `${contract.prefix}client-${run}`, allowAutoTopicCreation: false })
  const delivered = [] // [topic, partition, key]
  let lastTs = 0

  // one record of message `title`, keyed as its channel says (the payload's `key` field)
  async function send (title, fields) {
    lastTs = Math.max(Date.now() / 1000, lastTs + 0.001) // never an older ts after a newer one
    const record = contract.record(title, { ...fields, ts: lastTs })
    const keyField = contract.message(title).bindings.kafka.key.description.replace(/ /g, '_')
    const topic = contract.topic(title)
    const key = String(record[keyField])
    const [meta] = await producer.send({ topic, acks: -1,
      messages: [{ key, value: Buffer.from(encode(record)), headers: contract.headers(title) }] })
    delivered.push([topic, meta.partition, key])
  }

  const pushed = []
  async function push (sid, seq) {
    await send('InputPushed', { session_id: sid, seq, kind: 'text', payload: `pan left #${seq}` })
    pushed.push(`${sid}\0${seq}`)
  }

  const summary = { sessions, pushed: 0, accepted: 0, claimed: 0, closed: 0, refused: [], delivered }
  let ok = false
  try {
    await producer.connect()
    await consumer.connect()
    await consumer.subscribe({ topics: [contract.topic('InputAccepted'), contract.topic('DeadLetter')], fromBeginning: true })
    await consumer.run({ eachMessage: async ({ message }) => ledger.take(message.value) })

    const first = Math.ceil(opts.inputs / 2)
    for (const sid of sessions) await send('SessionOpened', { session_id: sid, prompt: `a lighthouse at dusk, ${sid}` })
    for (let seq = 1; seq <= first; seq++) for (const sid of sessions) await push(sid, seq)
    log(`opened ${sessions.length} sessions, pushed inputs 1..${first}`)
    await until(() => ledger.claimed.size === sessions.length, deadline, 'every session claimed')
    for (const sid of sessions) await send('SessionIdle', { session_id: sid })
    for (const sid of sessions) await send('SessionActive', { session_id: sid })
    for (let seq = first + 1; seq <= opts.inputs; seq++) for (const sid of sessions) await push(sid, seq)
    log(`idle and active sent, pushed inputs ${first + 1}..${opts.inputs}`)

    const settled = () => ledger.refused.length > 0 || pushed.every(k => ledger.accepted.has(k))
    await until(settled, deadline, 'every input accepted')
    if (ledger.refused.length === 0) {
      for (const sid of sessions) await send('SessionClosed', { session_id: sid })
      await until(() => ledger.closed.size === sessions.length, deadline, 'every session released as closed')
      ok = pushed.every(k => ledger.accepted.has(k)) && ledger.refused.length === 0
    }
  } catch (e) {
    log(String(e && e.message ? e.message : e))
  } finally {
    await Promise.allSettled([consumer.disconnect(), producer.disconnect()])
  }
  Object.assign(summary, { pushed: pushed.length, accepted: pushed.filter(k => ledger.accepted.has(k)).length,
    claimed: ledger.claimed.size, closed: ledger.closed.size, refused: ledger.refused })
  process.stdout.write(JSON.stringify(summary) + '\n')
  log(ok ? `every input accepted (${summary.accepted} of ${summary.pushed}), every session closed`
    : `FAILED: ${summary.accepted} of ${summary.pushed} inputs accepted, ${summary.refused.length} refused, ` +
      `${summary.closed} of ${sessions.length} sessions released as closed`)
  process.exitCode = ok ? 0 : 1
}

main()
