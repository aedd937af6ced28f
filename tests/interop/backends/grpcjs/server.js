'use strict';
// A grpc-js test backend for grpc-client-kit's interop tests (`npm ci` in this folder first).
//
// Serves gck.test.v1.TestService (a service definition with hand-written serializers: there is
// no .proto file) and, unless --no-health, the official grpc-health-check service. Driven over
// stdin/stdout by tests/interop/support/mod.rs with the same protocol as every implementation:
//
//   ready <port>                      printed once serving
//   health <service|-> <STATUS>       STATUS: SERVING, NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN
//   fail <n> <code>                   the next n Unary calls fail with <code>, "injected failure"
//   delay <ms>                        every TestService call waits this long first (0: off)
//   hits                              -> ok <Unary calls received>
//   stop <grace_ms>                   graceful stop; answers once stopped, then exits 0
//
// Each command is answered with one line: "ok", "ok <value>" or "error: <why>". Closing stdin
// ends the process at once.
//
// Server settings: grpc-js 1.14's Server reads grpc.max_connection_age_ms,
// grpc.max_connection_age_grace_ms and grpc.max_connection_idle_ms (and keepalive pings of its
// own). It has no keepalive enforcement at all (no minimum ping interval, no ping strikes, no
// permit-without-calls: every client PING is answered), so those three flags are refused with
// exit code 2.

const readline = require('readline');
const grpc = require('@grpc/grpc-js');
const { HealthImplementation } = require('grpc-health-check');

const SERVICE = 'gck.test.v1.TestService';
const STATUSES = ['UNKNOWN', 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN'];

// ----- protobuf wire format, by hand -----

function encodeVarint(out, value) {
  let v = BigInt(value);
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
}

function readVarint(buf, at) {
  let value = 0n;
  let shift = 0n;
  for (let i = at; i < buf.length && i < at + 10; i++) {
    value |= BigInt(buf[i] & 0x7f) << shift;
    if (buf[i] < 0x80) {
      return [value, i + 1];
    }
    shift += 7n;
  }
  throw new Error('bad varint');
}

// Calls f(number, value) for every field: a BigInt for a varint, a Buffer for a
// length-delimited field; fixed-width fields are skipped.
function eachField(buf, f) {
  let at = 0;
  while (at < buf.length) {
    const [key, next] = readVarint(buf, at);
    at = next;
    const number = Number(key >> 3n);
    const wireType = Number(key & 7n);
    if (wireType === 0) {
      const [value, after] = readVarint(buf, at);
      at = after;
      f(number, value);
    } else if (wireType === 2) {
      const [length, start] = readVarint(buf, at);
      const end = start + Number(length);
      if (end > buf.length) {
        throw new Error('truncated field');
      }
      f(number, buf.subarray(start, end));
      at = end;
    } else if (wireType === 1) {
      at += 8;
    } else if (wireType === 5) {
      at += 4;
    } else {
      throw new Error(`unsupported wire type ${wireType}`);
    }
  }
}

function encodeString(out, number, text) {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length === 0) {
    return;
  }
  encodeVarint(out, (number << 3) | 2);
  encodeVarint(out, bytes.length);
  for (const b of bytes) {
    out.push(b);
  }
}

// Ping { string payload = 1; }
function decodePing(buf) {
  const ping = { payload: '' };
  eachField(buf, (number, value) => {
    if (number === 1 && Buffer.isBuffer(value)) {
      ping.payload = value.toString('utf8');
    }
  });
  return ping;
}

function encodePing(ping) {
  const out = [];
  encodeString(out, 1, ping.payload || '');
  return Buffer.from(out);
}

// StreamPing { uint32 count = 1; }
function decodeStreamPing(buf) {
  const ping = { count: 0 };
  eachField(buf, (number, value) => {
    if (number === 1 && typeof value === 'bigint') {
      ping.count = Number(value & 0xffffffffn);
    }
  });
  return ping;
}

function encodeStreamPing(ping) {
  const out = [];
  if (ping.count) {
    encodeVarint(out, 1 << 3);
    encodeVarint(out, ping.count);
  }
  return Buffer.from(out);
}

// Pong { string backend = 1; uint64 seq = 2; string payload = 3; }
function encodePong(pong) {
  const out = [];
  encodeString(out, 1, pong.backend);
  if (pong.seq) {
    encodeVarint(out, 2 << 3);
    encodeVarint(out, pong.seq);
  }
  encodeString(out, 3, pong.payload || '');
  return Buffer.from(out);
}

function decodePong(buf) {
  const pong = { backend: '', seq: 0, payload: '' };
  eachField(buf, (number, value) => {
    if (number === 1 && Buffer.isBuffer(value)) {
      pong.backend = value.toString('utf8');
    } else if (number === 2 && typeof value === 'bigint') {
      pong.seq = Number(value);
    } else if (number === 3 && Buffer.isBuffer(value)) {
      pong.payload = value.toString('utf8');
    }
  });
  return pong;
}

const testServiceDefinition = {
  unary: {
    path: `/${SERVICE}/Unary`,
    originalName: 'Unary',
    requestStream: false,
    responseStream: false,
    requestSerialize: encodePing,
    requestDeserialize: decodePing,
    responseSerialize: encodePong,
    responseDeserialize: decodePong,
  },
  serverStream: {
    path: `/${SERVICE}/ServerStream`,
    originalName: 'ServerStream',
    requestStream: false,
    responseStream: true,
    requestSerialize: encodeStreamPing,
    requestDeserialize: decodeStreamPing,
    responseSerialize: encodePong,
    responseDeserialize: decodePong,
  },
};

// ----- command line -----

function refuse(message) {
  process.stderr.write(`grpc-js backend: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const args = { name: 'b0', port: 0, health: true, options: {} };
  const settings = {
    '--max-connection-age-ms': 'grpc.max_connection_age_ms',
    '--max-connection-age-grace-ms': 'grpc.max_connection_age_grace_ms',
    '--max-connection-idle-ms': 'grpc.max_connection_idle_ms',
  };
  const unsupported = {
    '--min-ping-interval-ms': 'grpc-js has no keepalive enforcement (no minimum ping interval)',
    '--max-ping-strikes': 'grpc-js has no keepalive enforcement (no ping strikes)',
    '--permit-without-calls':
      'grpc-js has no keepalive enforcement (pings without calls are always allowed)',
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) {
        refuse(`${flag} wants a value`);
      }
      const n = Number(argv[++i]);
      if (!Number.isInteger(n) || n < 0) {
        refuse(`${flag} wants a whole number, not ${argv[i]}`);
      }
      return n;
    };
    if (flag === '--name') {
      if (i + 1 >= argv.length) {
        refuse('--name wants a value');
      }
      args.name = argv[++i];
    } else if (flag === '--port') {
      args.port = value();
    } else if (flag === '--no-health') {
      args.health = false;
    } else if (flag in settings) {
      const n = value();
      if (n < 1) {
        refuse(`${flag} ${n} refused: give a positive number of milliseconds`);
      }
      args.options[settings[flag]] = n;
    } else if (flag in unsupported) {
      refuse(`${flag} refused: ${unsupported[flag]}`);
    } else {
      refuse(`unknown argument ${flag}`);
    }
  }
  return args;
}

// ----- the backend -----

function main() {
  const args = parseArgs(process.argv.slice(2));
  const state = { hits: 0, failRemaining: 0, failCode: 0, delayMs: 0 };
  const server = new grpc.Server(args.options);

  const afterDelay = (then) => {
    if (state.delayMs > 0) {
      setTimeout(then, state.delayMs);
    } else {
      then();
    }
  };
  server.addService(testServiceDefinition, {
    unary: (call, callback) => {
      state.hits += 1;
      const seq = state.hits;
      let failure = null;
      if (state.failRemaining > 0) {
        state.failRemaining -= 1;
        failure = state.failCode;
      }
      afterDelay(() => {
        if (failure !== null) {
          callback({ code: failure, details: 'injected failure' });
        } else {
          callback(null, { backend: args.name, seq, payload: call.request.payload });
        }
      });
    },
    serverStream: (call) => {
      afterDelay(() => {
        for (let seq = 0; seq < call.request.count; seq++) {
          call.write({ backend: args.name, seq, payload: '' });
        }
        call.end();
      });
    },
  });

  let health = null;
  if (args.health) {
    health = new HealthImplementation({ '': 'SERVING', [SERVICE]: 'SERVING' });
    health.addToServer(server);
  }

  const commands = {
    health: ([service, status]) => {
      if (health === null) {
        return 'error: started with --no-health';
      }
      if (!STATUSES.includes(status)) {
        return `error: unknown status ${status}`;
      }
      health.setStatus(service === '-' ? '' : service, status);
      return 'ok';
    },
    fail: ([n, code]) => {
      const count = Number(n);
      const c = Number(code);
      if (!Number.isInteger(count) || count < 0 || !Number.isInteger(c) || c < 0 || c > 16 ||
        (count > 0 && c === 0)) {
        return 'error: fail wants n >= 0 and a failure code 1..16';
      }
      state.failRemaining = count;
      state.failCode = c;
      return 'ok';
    },
    delay: ([ms]) => {
      const d = Number(ms);
      if (!Number.isInteger(d) || d < 0) {
        return 'error: delay wants ms >= 0';
      }
      state.delayMs = d;
      return 'ok';
    },
    hits: () => `ok ${state.hits}`,
  };
  const arity = { health: 2, fail: 2, delay: 1, hits: 0 };

  server.bindAsync(`127.0.0.1:${args.port}`, grpc.ServerCredentials.createInsecure(),
    (error, port) => {
      if (error) {
        process.stderr.write(`grpc-js backend: cannot bind 127.0.0.1:${args.port}: ${error.message}\n`);
        process.exit(1);
      }
      process.stdout.write(`ready ${port}\n`);

      let stopping = false;
      const lines = readline.createInterface({ input: process.stdin });
      lines.on('line', (line) => {
        if (stopping) {
          return;
        }
        const words = line.trim().split(/\s+/).filter((w) => w !== '');
        const [command, ...rest] = words;
        if (command === 'stop' && rest.length === 1) {
          const grace = Number(rest[0]);
          if (!Number.isInteger(grace) || grace < 0) {
            process.stdout.write('error: stop wants grace ms >= 0\n');
            return;
          }
          stopping = true;
          // tryShutdown closes the listener at once and every session gracefully (GOAWAY, calls
          // finish); whatever is still open after the grace (a health Watch never ends) is
          // destroyed.
          const stopped = () => {
            process.stdout.write('ok\n');
            process.exit(0);
          };
          setTimeout(() => {
            server.forceShutdown();
            // The sessions' close events end tryShutdown below; this is only a safety net.
            setTimeout(stopped, 1000);
          }, grace);
          server.tryShutdown(stopped);
          return;
        }
        let answer;
        if (command in commands && rest.length === arity[command]) {
          answer = commands[command](rest);
        } else {
          answer = `error: unknown command ${words.join(' ')}`;
        }
        process.stdout.write(`${answer}\n`);
      });
      // stdin closed: exit at once.
      lines.on('close', () => {
        if (!stopping) {
          process.exit(0);
        }
      });
    });
}

main();
