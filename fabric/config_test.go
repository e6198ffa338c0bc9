package fabric

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.json")
	os.WriteFile(path, []byte(`{"node_name": "n1", "join": ["10.0.0.1:7946"], "pools": ["host=2GiB"], "lease_duration": "45s", "dev": true}`), 0o600)
	c, err := LoadConfigFile(path, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "n1" || len(c.Join) != 1 || c.Pools[0] != "host=2GiB" || c.LeaseDuration != 45*time.Second || !c.Dev {
		t.Fatalf("file not applied: %+v", c)
	}
	if c.PeerAddr != DefaultConfig().PeerAddr || c.ImportTimeout != 30*time.Second {
		t.Fatalf("fields the file does not set were changed: %+v", c)
	}
	for bad, want := range map[string]string{
		`{"node_nme": "typo"}`:         `unknown key "node_nme": no setting has it`,
		`{"lease_duration": 30}`:       "lease_duration: want a duration string",
		`{"import_timeout": "soon"}`:   "import_timeout",
		`not json`:                     "invalid character",
		`{"logger": null}`:             `unknown key "logger"`, // a field no file sets
		`{"hooks": {}}`:                `unknown key "hooks"`,
		`{"NodeName": "zz"}`:           `unknown key "NodeName": no setting has it`,
		`{"Node_Name": "zz"}`:          `unknown key "Node_Name": keys are lower case ("node_name")`,
		`{"NODE_NAME": "zz"}`:          `unknown key "NODE_NAME": keys are lower case ("node_name")`,
		`{"Block_Set_Grace": 30}`:      `unknown key "Block_Set_Grace"`, // was 30ns, past the durations' check
		`{"Tier_Read_Ahead": 0}`:       `unknown key "Tier_Read_Ahead"`,
		`{"node_name": "a", "Dev": 1}`: `unknown key "Dev"`,
	} {
		os.WriteFile(path, []byte(bad), 0o600)
		if _, err := LoadConfigFile(path, DefaultConfig()); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want ErrConfig saying %q", bad, err, want)
		}
	}
}

func TestValidateConfig(t *testing.T) {
	cases := []struct {
		name  string
		mut   func(c *Config)
		field string
	}{
		{"space in name", func(c *Config) { c.NodeName = "a b" }, "node_name"},
		{"colon in name", func(c *Config) { c.NodeName = "a:b" }, "node_name"},
		{"name a byte past its limit", func(c *Config) { c.NodeName = strings.Repeat("n", MaxNodeName+1) }, "node_name"},
		{"gossip addr without port", func(c *Config) { c.GossipAddr = "127.0.0.1" }, "gossip_addr"},
		{"bad port", func(c *Config) { c.PeerAddr = "127.0.0.1:99999" }, "peer_addr"},
		{"cluster name a byte past its limit", func(c *Config) { c.ClusterName = strings.Repeat("c", 256) }, "cluster_name"},
		{"gossip bound to a name", func(c *Config) { c.GossipAddr = "bogus.invalid:17946" }, "gossip_addr"},
		{"gossip advertising a name", func(c *Config) { c.GossipAdvertise = "node7.example:7946" }, "gossip_advertise"},
		{"gossip advertising 0.0.0.0", func(c *Config) { c.GossipAdvertise = "0.0.0.0:7946" }, "gossip_advertise"},
		{"gossip advertising port 0", func(c *Config) { c.GossipAdvertise = "10.0.0.7:0" }, "gossip_advertise"},
		{"peers told 0.0.0.0:0", func(c *Config) { c.PeerAdvertise = "0.0.0.0:0" }, "peer_advertise"},
		{"peers told ::", func(c *Config) { c.PeerAdvertise = "[::]:7947" }, "peer_advertise"},
		{"bad join", func(c *Config) { c.Join = []string{"x"} }, "join[0]"},
		{"no tls", func(c *Config) { c.Dev = false }, "ca_file"},
		{"bad level", func(c *Config) { c.LogLevel = "loud" }, "log_level"},
		{"bad log format", func(c *Config) { c.LogFormat = "xml" }, "log_format"},
		{"negative lease", func(c *Config) { c.LeaseDuration = -time.Second }, "lease_duration"},
		{"bad pool", func(c *Config) { c.Pools = []string{"host"} }, "pools[0]"},
		{"unknown pool kind", func(c *Config) { c.Pools = []string{"gpu=1GiB"} }, "pools[0]"},
		{"zero pool", func(c *Config) { c.Pools = []string{"host=0"} }, "pools[0]"},
		{"two host pools", func(c *Config) { c.Pools = []string{"host=1GiB", "pinned=2GiB"} }, "pools[1]"},
		{"device fraction zero", func(c *Config) { c.Pools = []string{"device=0.0"} }, "pools[0]"},
		{"device fraction past one", func(c *Config) { c.Pools = []string{"device=1.01"} }, "pools[0]"},
		{"device size zero", func(c *Config) { c.Pools = []string{"device=0"} }, "pools[0]"},
		{"device index past its bound", func(c *Config) { c.Pools = []string{"device:256=1GiB"} }, "pools[0]"},
		{"device index not a number", func(c *Config) { c.Pools = []string{"device:x=1GiB"} }, "pools[0]"},
		{"same GPU twice", func(c *Config) { c.Pools = []string{"device:1=1GiB", "device:1=0.5"} }, "pools[1]"},
		{"every GPU and one GPU", func(c *Config) { c.Pools = []string{"device=1GiB", "device:0=1GiB"} }, "pools[1]"},
		{"lease too long for holders", func(c *Config) { c.LeaseDuration = 10 * time.Minute }, "lease_duration"},
		{"lease too short", func(c *Config) { c.LeaseDuration = time.Millisecond }, "lease_duration"},
		{"import chunk a byte under its floor", func(c *Config) { c.ImportChunkBytes = minImportChunk - 1 }, "import_chunk_bytes"},
		{"import chunk a byte over its ceiling", func(c *Config) { c.ImportChunkBytes = maxImportChunk + 1 }, "import_chunk_bytes"},
		{"negative lease cap per peer", func(c *Config) { c.MaxLeasedPerPeer = -1 }, "max_leased_per_peer"},
		{"negative lease cap", func(c *Config) { c.MaxLeased = -1 }, "max_leased"},
		{"negative block set slots", func(c *Config) { c.BlockSetSlots = -1 }, "block_set_slots"},
		{"block set slots past layout.MaxSlots", func(c *Config) { c.BlockSetSlots = layout.MaxSlots + 1 }, "block_set_slots"},
		{"request memory a byte under its floor", func(c *Config) { c.EngineRequestMemory = MinEngineRequestMemory - 1 }, "engine_request_memory"},
		{"session request memory a byte under its floor", func(c *Config) { c.EngineSessionRequestMemory = MinEngineRequestMemory - 1 }, "engine_session_request_memory"},
		{"engine quota a byte under its floor", func(c *Config) { c.EngineQuota = MinEngineQuota - 1 }, "engine_quota"},
		{"keepalive a nanosecond under its floor", func(c *Config) { c.SessionKeepalive = MinSessionKeepalive - 1 }, "session_keepalive"},
		{"keepalive a nanosecond over its ceiling", func(c *Config) { c.SessionKeepalive = MaxSessionKeepalive + 1 }, "session_keepalive"},
		{"negative keepalive", func(c *Config) { c.SessionKeepalive = -time.Second }, "session_keepalive"},
		{"grace over its ceiling", func(c *Config) { c.BlockSetGrace = MaxBlockSetGrace + 1 }, "block_set_grace"},
		{"negative grace", func(c *Config) { c.BlockSetGrace = -time.Second }, "block_set_grace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultLocalConfig()
			tc.mut(&c)
			c.populate()
			_, err := c.validate()
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want an error naming %s", err, tc.field)
			}
		})
	}
	c := DefaultLocalConfig()
	c.NodeName = strings.Repeat("n", MaxNodeName) // at its limit
	c.populate()
	specs, err := c.validate()
	if err != nil || len(specs) != 1 || specs[0] != (PoolSpec{Kind: "host", Size: 1 << 30}) {
		t.Fatalf("defaults: %v %v", specs, err)
	}
	// Device pools: every GPU, one GPU, a fraction at its bound 1, the
	// highest index, beside a host pool.
	c = DefaultLocalConfig()
	c.Pools = []string{"pinned=64MiB", "device:0=0.5", "device:255=1.0", "device:3=2GiB"}
	c.populate()
	specs, err = c.validate()
	want := []PoolSpec{{Kind: "pinned", Size: 64 << 20}, {Kind: "device", Fraction: 0.5}, {Kind: "device", Fraction: 1, GPU: 255},
		{Kind: "device", Size: 2 << 30, GPU: 3}}
	if err != nil || len(specs) != len(want) {
		t.Fatalf("device pools: %v %v", specs, err)
	}
	for i := range want {
		if specs[i] != want[i] {
			t.Errorf("pools[%d] = %+v, want %+v", i, specs[i], want[i])
		}
	}
	if s, err := ParsePoolSpec("device=0.25"); err != nil || s != (PoolSpec{Kind: "device", Fraction: 0.25, GPU: -1}) {
		t.Errorf("device=0.25: %+v %v", s, err)
	}
	// Each bound is itself allowed.
	for _, n := range []int64{minImportChunk, maxImportChunk} {
		c := DefaultLocalConfig()
		c.ImportChunkBytes = n
		c.populate()
		if _, err := c.validate(); err != nil {
			t.Errorf("import_chunk_bytes %d (a bound): %v", n, err)
		}
	}
	for _, d := range []time.Duration{MinSessionKeepalive, MaxSessionKeepalive} {
		c := DefaultLocalConfig()
		c.SessionKeepalive = d
		c.populate()
		if _, err := c.validate(); err != nil {
			t.Errorf("session_keepalive %v (a bound): %v", d, err)
		}
	}
	c = DefaultLocalConfig()
	c.EngineRequestMemory, c.EngineSessionRequestMemory, c.EngineQuota = MinEngineRequestMemory, MinEngineRequestMemory, MinEngineQuota
	c.populate()
	if _, err := c.validate(); err != nil {
		t.Errorf("engine request memory, per session, and quota at their floors: %v", err)
	}
	c = DefaultLocalConfig()
	c.BlockSetSlots = layout.MaxSlots
	c.populate()
	if _, err := c.validate(); err != nil {
		t.Errorf("block_set_slots %d (the bound): %v", layout.MaxSlots, err)
	}
	c = DefaultLocalConfig()
	c.BlockSetGrace = MaxBlockSetGrace
	c.populate()
	if _, err := c.validate(); err != nil {
		t.Errorf("block_set_grace %v (the bound): %v", MaxBlockSetGrace, err)
	}
	// Zero takes the documented defaults.
	c = Config{}
	c.populate()
	if c.SessionKeepalive != 5*time.Second || c.BlockSetGrace != 30*time.Second {
		t.Errorf("zero keepalive and grace became %v and %v, want 5s and 30s", c.SessionKeepalive, c.BlockSetGrace)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"4096": 4096, "512MiB": 512 << 20, "2GiB": 2 << 30, "1TiB": 1 << 40, "64KiB": 64 << 10, "10B": 10} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "1.5GiB", "GiB", "99999999999TiB"} {
		if _, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q): no error", in)
		}
	}
	// The error quotes the size as given, unit included (it quoted "1G"
	// of "1GB"), and names a unit that is not one.
	for in, want := range map[string]string{
		"1GB":            `size "1GB" is not a positive number of bytes with an optional unit KiB, MiB, GiB, TiB or B (e.g. 512MiB, 4GiB): "GB" is not one of them`,
		"64 MB":          `size "64 MB" is not a positive number of bytes with an optional unit KiB, MiB, GiB, TiB or B (e.g. 512MiB, 4GiB): "MB" is not one of them`,
		"2g":             `size "2g" is not`,
		"1.5GiB":         `size "1.5GiB" is not a positive number of bytes with an optional unit KiB, MiB, GiB, TiB or B (e.g. 512MiB, 4GiB)`,
		"0MiB":           `size "0MiB" is not a positive number`,
		"lots":           `size "lots" is not a positive number`,
		"99999999999TiB": `size "99999999999TiB" overflows`,
	} {
		_, err := ParseSize(in)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ParseSize(%q): %v, want an error saying %q", in, err, want)
		}
		if strings.HasSuffix(in, "iB") && err != nil && strings.Contains(err.Error(), "is not one of them") {
			t.Errorf("ParseSize(%q): %v names a unit that is one", in, err)
		}
	}
}

// The agent's own logger writes text or JSON lines at the level asked.
func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	newLogger(&buf, "json", "info").Info("member joined", "peer", "n2")
	newLogger(&buf, "json", "info").Debug("not shown")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil || line["msg"] != "member joined" || line["peer"] != "n2" || line["level"] != "INFO" {
		t.Fatalf("json line %q: %v %v", buf.String(), line, err)
	}
	buf.Reset()
	newLogger(&buf, "text", "warn").Info("not shown")
	newLogger(&buf, "text", "warn").Warn("member failed", "peer", "n2")
	if got := buf.String(); !strings.Contains(got, `level=WARN msg="member failed" peer=n2`) || strings.Contains(got, "not shown") {
		t.Fatalf("text at warn: %q", got)
	}
}

// The example configuration operators start from loads and is valid.
func TestExampleConfig(t *testing.T) {
	c, err := LoadConfigFile("../deploy/agent.json", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	c.populate()
	if _, err := c.validate(); err != nil {
		t.Fatalf("deploy/agent.json: %v", err)
	}
	if c.NodeName != "gpu-node-07" || len(c.Join) != 2 || c.LogFormat != "json" || c.ImportChunkBytes != 64<<20 {
		t.Fatalf("deploy/agent.json not read as written: %+v", c)
	}
}

// What MarshalConfig writes, LoadConfigFile reads back to the same
// configuration.
func TestMarshalConfigRoundTrip(t *testing.T) {
	c, err := LoadConfigFile("../deploy/agent.json", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	c, err = c.Resolved()
	if err != nil {
		t.Fatal(err)
	}
	b, err := MarshalConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "effective.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	back, err := LoadConfigFile(path, Config{})
	if err != nil {
		t.Fatalf("%v in:\n%s", err, b)
	}
	if back.LeaseDuration != c.LeaseDuration || back.SessionKeepalive != c.SessionKeepalive || back.BlockSetGrace != c.BlockSetGrace || back.NodeName != c.NodeName || back.ImportChunkBytes != c.ImportChunkBytes ||
		strings.Join(back.Join, ",") != strings.Join(c.Join, ",") || back.EngineSocket != c.EngineSocket || back.DevCADir != c.DevCADir {
		t.Fatalf("round trip changed the configuration:\n%s\nread back %+v", b, back)
	}
}

// What --print-config writes (MarshalConfig of the resolved settings)
// reads back, over either set of defaults, to the same settings, each
// setting at its zero value included: one whose zero means something
// other than the default it would be read over (tier_read_ahead 0, off,
// over DefaultTierReadAhead; dev and local false over
// DefaultLocalConfig's true) is written, not left out.
func TestMarshalConfigRoundTripsZeros(t *testing.T) {
	bases := []struct {
		name string
		make func() Config
	}{{"DefaultConfig", DefaultConfig}, {"DefaultLocalConfig", DefaultLocalConfig}}
	dir := t.TempDir()
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		f := ct.Field(i)
		key, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || key == "-" {
			continue
		}
		for _, from := range bases {
			c := from.make()
			c.CAFile, c.CertFile, c.KeyFile = "ca.crt", "n1.crt", "n1.key" // valid with dev false too
			reflect.ValueOf(&c).Elem().Field(i).SetZero()
			eff, err := c.Resolved()
			if err != nil {
				if key == "ca_file" || key == "cert_file" || key == "key_file" {
					continue // required without dev
				}
				t.Fatalf("%s zero over %s: %v", key, from.name, err)
			}
			b, err := MarshalConfig(eff)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "printed.json")
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, onto := range bases {
				back, err := LoadConfigFile(path, onto.make())
				if err != nil {
					t.Fatalf("%s zero over %s, read over %s: %v\n%s", key, from.name, onto.name, err, b)
				}
				if back, err = back.Resolved(); err != nil {
					t.Fatalf("%s zero over %s, read over %s: %v\n%s", key, from.name, onto.name, err, b)
				}
				for j := range ct.NumField() {
					if g := ct.Field(j); g.IsExported() && !reflect.DeepEqual(reflect.ValueOf(eff).Field(j).Interface(), reflect.ValueOf(back).Field(j).Interface()) {
						t.Errorf("%s zero over %s, printed and read over %s: %s %v became %v", key, from.name, onto.name, g.Name,
							reflect.ValueOf(eff).Field(j), reflect.ValueOf(back).Field(j))
					}
				}
			}
		}
	}
}

// Every duration setting: zero takes its default, DefaultConfig has it,
// its bounds are accepted and a nanosecond past them refused naming its
// key, and its file form is a string that reads back.
func TestDurationSettings(t *testing.T) {
	ct := reflect.TypeFor[Config]()
	for _, s := range durationSettings {
		t.Run(s.Key, func(t *testing.T) {
			f, ok := ct.FieldByName(s.Field)
			if !ok || f.Type != reflect.TypeFor[time.Duration]() || strings.Split(f.Tag.Get("json"), ",")[0] != s.Key {
				t.Fatalf("field %s: %v, type %v, tag %q: want a time.Duration keyed %s", s.Field, ok, f.Type, f.Tag, s.Key)
			}
			if got, ok := DurationSettingOf(s.Field); !ok || got.Key != s.Key {
				t.Fatalf("DurationSettingOf(%s) = %+v, %v", s.Field, got, ok)
			}
			d := DefaultConfig()
			if *s.field(&d) != s.Default || !s.within(s.Default) {
				t.Fatalf("DefaultConfig has %v, the setting's default is %v (bounds %s)", *s.field(&d), s.Default, s.Range())
			}
			valid := func(v time.Duration) error {
				c := DefaultLocalConfig()
				*s.field(&c) = v
				c.populate()
				_, err := c.validate()
				return err
			}
			zero := DefaultLocalConfig()
			*s.field(&zero) = 0
			zero.populate()
			if *s.field(&zero) != s.Default {
				t.Errorf("zero became %v, want the default %v", *s.field(&zero), s.Default)
			}
			at := []time.Duration{s.Default}
			past := []time.Duration{-1}
			if s.Min > 0 {
				at, past = append(at, s.Min), append(past, s.Min-1)
			}
			if s.Max > 0 {
				at, past = append(at, s.Max), append(past, s.Max+1)
			}
			for _, v := range at {
				if err := valid(v); err != nil {
					t.Errorf("%v (at a bound or the default): %v", v, err)
				}
			}
			for _, v := range past {
				if err := valid(v); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), s.Key) {
					t.Errorf("%v (past a bound): %v, want ErrConfig naming %s", v, err, s.Key)
				}
			}
		})
	}
}

func TestDurationText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		str  string
	}{
		{"30s", 30 * time.Second, "30s"},
		{"5m", 5 * time.Minute, "5m"},
		{"24h", 24 * time.Hour, "24h"},
		{"1h30m", 90 * time.Minute, "1h30m"},
		{"100ms", 100 * time.Millisecond, "100ms"},
		{"10m0s", 10 * time.Minute, "10m"},
		{"1h0m30s", time.Hour + 30*time.Second, "1h0m30s"},
		{"25h0m0.5s", 25*time.Hour + 500*time.Millisecond, "25h0m0.5s"},
	} {
		var d Duration
		if err := json.Unmarshal([]byte(`"`+tc.in+`"`), &d); err != nil || time.Duration(d) != tc.want {
			t.Errorf("%q: %v, %v; want %v", tc.in, time.Duration(d), err, tc.want)
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		// A file gets the help's form: "10m", not "10m0s".
		if string(b) != `"`+tc.str+`"` {
			t.Errorf("%q: written as %s, want %q", tc.in, b, tc.str)
		}
		var back Duration
		if err := json.Unmarshal(b, &back); err != nil || back != d {
			t.Errorf("%q: written as %s, read back %v, %v", tc.in, b, back, err)
		}
		if d.String() != tc.str {
			t.Errorf("%q: String %q, want %q", tc.in, d.String(), tc.str)
		}
	}
	var d Duration
	for _, bad := range []string{`"soon"`, `30`, `""`} {
		if err := json.Unmarshal([]byte(bad), &d); err == nil {
			t.Errorf("%s read as a duration", bad)
		}
	}
}

// A refused setting is a SettingError: its key, with an entry's index, and
// why; it matches ErrConfig and reads as every configuration error does.
func TestSettingError(t *testing.T) {
	c := DefaultLocalConfig()
	c.Tiers = []string{"disk=/d:1GiB", "disk=relative:1GiB"}
	c.populate()
	_, err := c.validate()
	var se *SettingError
	if !errors.As(err, &se) || !errors.Is(err, ErrConfig) || se.Err != nil {
		t.Fatalf("%v (%T): want a SettingError wrapping ErrConfig alone", err, err)
	}
	if se.Key != "tiers[1]" || se.Setting() != "tiers" || !strings.HasPrefix(se.Why, `"disk=relative:1GiB": path`) ||
		err.Error() != "fabric: invalid configuration: tiers[1]: "+se.Why {
		t.Fatalf("key %q, setting %q, why %q, reads %q", se.Key, se.Setting(), se.Why, err)
	}
}
