// A grpc-go test backend for grpc-client-kit's interop tests.
//
// Built offline in GOPATH mode against Debian's golang-google-grpc-dev (grpc-go 1.33):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode go build -o grpcgo-server server.go
//
// Serves gck.test.v1.TestService (a grpc.ServiceDesc registered by hand; its messages are
// hand-encoded below, there is no .proto file) and, unless -no-health, grpc-go's own
// google.golang.org/grpc/health server. Driven over stdin/stdout by
// tests/interop/support/mod.rs with the same protocol as every other implementation:
//
//	ready <port>                      printed once serving
//	health <service|-> <STATUS>       STATUS: SERVING, NOT_SERVING, UNKNOWN, SERVICE_UNKNOWN
//	fail <n> <code>                   the next n Unary calls fail with <code>, "injected failure"
//	delay <ms>                        every TestService call waits this long first (0: off)
//	hits                              -> ok <Unary calls received>
//	stop <grace_ms>                   graceful stop; answers once stopped, then exits 0
//
// Each command is answered with one line: "ok", "ok <value>" or "error: <why>". Closing stdin
// ends the process at once. A setting grpc-go cannot honour is refused with exit code 2.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

const serviceName = "gck.test.v1.TestService"

// ----- protobuf wire format, by hand -----
//
// grpc-go 1.33's default codec ("proto", github.com/golang/protobuf 1.3) takes any value that
// is a proto.Message (Reset, String, ProtoMessage) and, to skip reflection, marshals a
// proto.Marshaler and unmarshals a proto.Unmarshaler by calling their own methods. The three
// messages below are such types; the health service keeps its real generated protobuf.

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func readVarint(b []byte) (uint64, int, error) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * uint(i))
		if b[i] < 0x80 {
			return v, i + 1, nil
		}
	}
	return 0, 0, errors.New("bad varint")
}

// eachField calls f with every field of a message: the varint for wire type 0, the bytes for
// wire type 2 (fixed-width fields are skipped).
func eachField(b []byte, f func(number uint64, varint uint64, bytes []byte)) error {
	for len(b) > 0 {
		key, n, err := readVarint(b)
		if err != nil {
			return err
		}
		b = b[n:]
		number, wireType := key>>3, key&7
		switch wireType {
		case 0:
			v, n, err := readVarint(b)
			if err != nil {
				return err
			}
			b = b[n:]
			f(number, v, nil)
		case 2:
			length, n, err := readVarint(b)
			if err != nil {
				return err
			}
			b = b[n:]
			if uint64(len(b)) < length {
				return errors.New("truncated field")
			}
			f(number, 0, b[:length])
			b = b[length:]
		case 1:
			if len(b) < 8 {
				return errors.New("truncated field")
			}
			b = b[8:]
		case 5:
			if len(b) < 4 {
				return errors.New("truncated field")
			}
			b = b[4:]
		default:
			return fmt.Errorf("unsupported wire type %d", wireType)
		}
	}
	return nil
}

func appendString(b []byte, number uint64, s string) []byte {
	if s == "" {
		return b
	}
	b = appendVarint(b, number<<3|2)
	b = appendVarint(b, uint64(len(s)))
	return append(b, s...)
}

// pingMsg is gck.test.v1.Ping { string payload = 1; }.
type pingMsg struct{ payload string }

func (m *pingMsg) Reset()         { *m = pingMsg{} }
func (m *pingMsg) String() string { return fmt.Sprintf("Ping{payload: %q}", m.payload) }
func (*pingMsg) ProtoMessage()    {}
func (m *pingMsg) Marshal() ([]byte, error) {
	return appendString(nil, 1, m.payload), nil
}
func (m *pingMsg) Unmarshal(b []byte) error {
	return eachField(b, func(number, _ uint64, bytes []byte) {
		if number == 1 && bytes != nil {
			m.payload = string(bytes)
		}
	})
}

// streamPingMsg is gck.test.v1.StreamPing { uint32 count = 1; }.
type streamPingMsg struct{ count uint32 }

func (m *streamPingMsg) Reset()         { *m = streamPingMsg{} }
func (m *streamPingMsg) String() string { return fmt.Sprintf("StreamPing{count: %d}", m.count) }
func (*streamPingMsg) ProtoMessage()    {}
func (m *streamPingMsg) Marshal() ([]byte, error) {
	if m.count == 0 {
		return nil, nil
	}
	return appendVarint([]byte{1 << 3}, uint64(m.count)), nil
}
func (m *streamPingMsg) Unmarshal(b []byte) error {
	return eachField(b, func(number, varint uint64, bytes []byte) {
		if number == 1 && bytes == nil {
			m.count = uint32(varint)
		}
	})
}

// pongMsg is gck.test.v1.Pong { string backend = 1; uint64 seq = 2; string payload = 3; }.
type pongMsg struct {
	backend string
	seq     uint64
	payload string
}

func (m *pongMsg) Reset() { *m = pongMsg{} }
func (m *pongMsg) String() string {
	return fmt.Sprintf("Pong{backend: %q, seq: %d, payload: %q}", m.backend, m.seq, m.payload)
}
func (*pongMsg) ProtoMessage() {}
func (m *pongMsg) Marshal() ([]byte, error) {
	b := appendString(nil, 1, m.backend)
	if m.seq != 0 {
		b = appendVarint(append(b, 2<<3), m.seq)
	}
	return appendString(b, 3, m.payload), nil
}
func (m *pongMsg) Unmarshal(b []byte) error {
	return eachField(b, func(number, varint uint64, bytes []byte) {
		switch {
		case number == 1 && bytes != nil:
			m.backend = string(bytes)
		case number == 2 && bytes == nil:
			m.seq = varint
		case number == 3 && bytes != nil:
			m.payload = string(bytes)
		}
	})
}

// ----- the test service -----

type backend struct {
	name string

	mu            sync.Mutex
	hits          uint64
	failRemaining uint64
	failCode      codes.Code
	delay         time.Duration
}

// testServiceServer is the handler type of the service description.
type testServiceServer interface {
	unary(ctx context.Context, in *pingMsg) (*pongMsg, error)
	serverStream(in *streamPingMsg, stream grpc.ServerStream) error
}

func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return status.Error(codes.Canceled, "call ended during the injected delay")
	}
}

func (b *backend) unary(ctx context.Context, in *pingMsg) (*pongMsg, error) {
	b.mu.Lock()
	b.hits++
	seq := b.hits
	fail := false
	code := b.failCode
	if b.failRemaining > 0 {
		b.failRemaining--
		fail = true
	}
	delay := b.delay
	b.mu.Unlock()
	if err := wait(ctx, delay); err != nil {
		return nil, err
	}
	if fail {
		return nil, status.Error(code, "injected failure")
	}
	return &pongMsg{backend: b.name, seq: seq, payload: in.payload}, nil
}

func (b *backend) serverStream(in *streamPingMsg, stream grpc.ServerStream) error {
	b.mu.Lock()
	delay := b.delay
	b.mu.Unlock()
	if err := wait(stream.Context(), delay); err != nil {
		return err
	}
	for seq := uint32(0); seq < in.count; seq++ {
		if err := stream.SendMsg(&pongMsg{backend: b.name, seq: uint64(seq)}); err != nil {
			return err
		}
	}
	return nil
}

var testServiceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*testServiceServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(srv interface{}, ctx context.Context, dec func(interface{}) error, _ grpc.UnaryServerInterceptor) (interface{}, error) {
			in := new(pingMsg)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(testServiceServer).unary(ctx, in)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "ServerStream",
		ServerStreams: true,
		Handler: func(srv interface{}, stream grpc.ServerStream) error {
			in := new(streamPingMsg)
			if err := stream.RecvMsg(in); err != nil {
				return err
			}
			return srv.(testServiceServer).serverStream(in, stream)
		},
	}},
}

// ----- command line -----

func refuse(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "grpc-go backend: "+format+"\n", args...)
	os.Exit(2)
}

func millis(name string, v int) time.Duration {
	if v < 1 {
		refuse("--%s %d refused: give a positive number of milliseconds (grpc-go reads 0 as its default)", name, v)
	}
	return time.Duration(v) * time.Millisecond
}

func serverOptions() (name string, port int, withHealth bool, opts []grpc.ServerOption) {
	flag.StringVar(&name, "name", "b0", "backend name, in every Pong")
	flag.IntVar(&port, "port", 0, "port on 127.0.0.1 (0: any free port)")
	noHealth := flag.Bool("no-health", false, "do not register grpc.health.v1")
	age := flag.Int("max-connection-age-ms", 0, "keepalive.ServerParameters.MaxConnectionAge")
	grace := flag.Int("max-connection-age-grace-ms", 0, "keepalive.ServerParameters.MaxConnectionAgeGrace")
	idle := flag.Int("max-connection-idle-ms", 0, "keepalive.ServerParameters.MaxConnectionIdle")
	minPing := flag.Int("min-ping-interval-ms", 0, "keepalive.EnforcementPolicy.MinTime")
	flag.Int("max-ping-strikes", 0, "refused: grpc-go's limit is fixed")
	permit := flag.Bool("permit-without-calls", false, "keepalive.EnforcementPolicy.PermitWithoutStream")
	flag.Parse()
	if flag.NArg() > 0 {
		refuse("unexpected argument %q", flag.Arg(0))
	}

	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["max-ping-strikes"] {
		refuse("--max-ping-strikes refused: grpc-go has no setting for it; its limit is fixed " +
			"(GOAWAY ENHANCE_YOUR_CALM \"too_many_pings\" once more than 2 pings came too soon)")
	}
	var params keepalive.ServerParameters
	if given["max-connection-age-ms"] {
		params.MaxConnectionAge = millis("max-connection-age-ms", *age)
	}
	if given["max-connection-age-grace-ms"] {
		params.MaxConnectionAgeGrace = millis("max-connection-age-grace-ms", *grace)
	}
	if given["max-connection-idle-ms"] {
		params.MaxConnectionIdle = millis("max-connection-idle-ms", *idle)
	}
	if params != (keepalive.ServerParameters{}) {
		opts = append(opts, grpc.KeepaliveParams(params))
	}
	var policy keepalive.EnforcementPolicy
	if given["min-ping-interval-ms"] {
		policy.MinTime = millis("min-ping-interval-ms", *minPing)
	}
	policy.PermitWithoutStream = *permit
	if policy != (keepalive.EnforcementPolicy{}) {
		opts = append(opts, grpc.KeepaliveEnforcementPolicy(policy))
	}
	return name, port, !*noHealth, opts
}

// ----- the control protocol -----

func (b *backend) command(words []string, server *grpc.Server, hs *health.Server) (answer string, exit bool) {
	if len(words) == 0 {
		return "error: empty command", false
	}
	args := words[1:]
	switch {
	case words[0] == "health" && len(args) == 2:
		if hs == nil {
			return "error: started with --no-health", false
		}
		value, ok := healthpb.HealthCheckResponse_ServingStatus_value[args[1]]
		if !ok {
			return "error: unknown status " + args[1], false
		}
		service := args[0]
		if service == "-" {
			service = ""
		}
		hs.SetServingStatus(service, healthpb.HealthCheckResponse_ServingStatus(value))
		return "ok", false
	case words[0] == "fail" && len(args) == 2:
		n, err1 := strconv.ParseUint(args[0], 10, 64)
		code, err2 := strconv.ParseUint(args[1], 10, 32)
		if err1 != nil || err2 != nil || code > 16 || (n > 0 && code == 0) {
			return "error: fail wants n >= 0 and a failure code 1..16", false
		}
		b.mu.Lock()
		b.failRemaining, b.failCode = n, codes.Code(code)
		b.mu.Unlock()
		return "ok", false
	case words[0] == "delay" && len(args) == 1:
		ms, err := strconv.ParseUint(args[0], 10, 32)
		if err != nil {
			return "error: delay wants ms >= 0", false
		}
		b.mu.Lock()
		b.delay = time.Duration(ms) * time.Millisecond
		b.mu.Unlock()
		return "ok", false
	case words[0] == "hits" && len(args) == 0:
		b.mu.Lock()
		defer b.mu.Unlock()
		return fmt.Sprintf("ok %d", b.hits), false
	case words[0] == "stop" && len(args) == 1:
		ms, err := strconv.ParseUint(args[0], 10, 32)
		if err != nil {
			return "error: stop wants grace ms >= 0", false
		}
		// GracefulStop closes the listener at once, sends GOAWAY and waits for the calls;
		// whatever is still open after the grace (a health Watch never ends) is closed.
		stopped := make(chan struct{})
		go func() {
			server.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(time.Duration(ms) * time.Millisecond):
			server.Stop()
			<-stopped
		}
		return "ok", true
	}
	return "error: unknown command " + strings.Join(words, " "), false
}

func main() {
	name, port, withHealth, opts := serverOptions()
	server := grpc.NewServer(opts...)
	b := &backend{name: name}
	server.RegisterService(&testServiceDesc, b)
	var hs *health.Server
	if withHealth {
		hs = health.NewServer()
		hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		hs.SetServingStatus(serviceName, healthpb.HealthCheckResponse_SERVING)
		healthpb.RegisterHealthServer(server, hs)
	}
	// Go's listeners set SO_REUSEADDR: a restart binds the same port again at once.
	lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		fmt.Fprintf(os.Stderr, "grpc-go backend: %v\n", err)
		os.Exit(1)
	}
	go func() {
		if err := server.Serve(lis); err != nil {
			fmt.Fprintf(os.Stderr, "grpc-go backend: serve: %v\n", err)
		}
	}()
	fmt.Printf("ready %d\n", lis.Addr().(*net.TCPAddr).Port)

	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		answer, exit := b.command(strings.Fields(lines.Text()), server, hs)
		fmt.Println(answer)
		if exit {
			os.Exit(0)
		}
	}
	// stdin closed: exit at once.
	os.Exit(0)
}
