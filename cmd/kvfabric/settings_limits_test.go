package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// Every documented limit of an agent setting, through the flag a user
// gives: the value at the limit takes effect (--print-config shows it),
// and one past it is a usage error that names the setting (its file key)
// and says what is wrong, before anything starts. The limits themselves
// are fabric's; fabric's tests hold them at the configuration's level.
func TestAgentSettingLimits(t *testing.T) {
	dir := t.TempDir()
	long := func(n int) string { return strings.Repeat("a", n) }
	tiers := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, "--tier", fmt.Sprintf("disk=%s:1GiB", filepath.Join(dir, fmt.Sprint("t", i))))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		args []string
		// shown is what --print-config prints for an accepted value, or
		// with a leading "!" what it must not print (a key left out for
		// its zero); refused what the error says (after the setting's key)
		// for one refused. One of the two.
		shown, refused string
	}{
		{"node name at 128 bytes", []string{"--node", long(128)}, `"node_name": "` + long(128) + `"`, ""},
		{"node name at 129 bytes", []string{"--node", long(129)}, "", "must be 1 to 128 letters, digits, '-', '.' or '_'"},
		{"node name of every character it may have", []string{"--node", "Gpu-node_07.rack-1"}, `"node_name": "Gpu-node_07.rack-1"`, ""},
		// Not a certificate's name: it failed once the agent had begun to
		// start.
		{"node name with a colon", []string{"--node", "a:b"}, "", `"a:b" must be 1 to 128 letters`},
		{"node name with a slash", []string{"--node", "a/b"}, "", `"a/b" must be 1 to 128 letters`},
		{"node name with a space", []string{"--node", "a b"}, "", `"a b" must be 1 to 128 letters`},
		{"node name not ASCII", []string{"--node", "nœud"}, "", `must be 1 to 128 letters`},

		// Addresses other nodes are told must be ones they can reach, and
		// gossip's must be IP addresses, which memberlist alone refused
		// once the agent had begun to start.
		{"gossip advertise an IP", []string{"--gossip-advertise", "10.0.0.7:7946"}, `"gossip_advertise": "10.0.0.7:7946"`, ""},
		{"gossip advertise 0.0.0.0", []string{"--gossip-advertise", "0.0.0.0:7946"}, "", `"0.0.0.0:7946": no address other nodes can reach`},
		{"gossip advertise ::", []string{"--gossip-advertise", "[::]:7946"}, "", `"[::]:7946": no address other nodes can reach`},
		{"gossip advertise port 0", []string{"--gossip-advertise", "10.0.0.7:0"}, "", `"10.0.0.7:0": port 0 is no port other nodes can reach`},
		{"gossip advertise a name", []string{"--gossip-advertise", "node7.example:7946"}, "", `host "node7.example" is not an IP address`},
		{"gossip bound to a name", []string{"--gossip-addr", "bogus.invalid:17946"}, "", `"bogus.invalid:17946": host "bogus.invalid" is not an IP address (gossip binds and advertises IP addresses; it resolves no names)`},
		{"gossip bound to no host", []string{"--gossip-addr", ":7946"}, "", `host "" is not an IP address`},
		{"gossip bound to any port", []string{"--gossip-addr", "0.0.0.0:0"}, `"gossip_addr": "0.0.0.0:0"`, ""},
		{"peer advertise a name", []string{"--peer-advertise", "node7.example:7947"}, `"peer_advertise": "node7.example:7947"`, ""},
		{"peer advertise 0.0.0.0", []string{"--peer-advertise", "0.0.0.0:7947"}, "", `"0.0.0.0:7947": no address other nodes can reach`},
		{"peer advertise 0.0.0.0:0", []string{"--peer-advertise", "0.0.0.0:0"}, "", "no address other nodes can reach"},
		{"peer advertise port 0", []string{"--peer-advertise", "10.0.0.7:0"}, "", "port 0 is no port other nodes can reach"},
		{"peer advertise no host", []string{"--peer-advertise", ":7947"}, "", "no address other nodes can reach"},

		// Gossip's label: past it memberlist refused the name once the
		// agent had begun to start.
		{"cluster name at 255 bytes", []string{"--cluster", long(255)}, `"cluster_name": "` + long(255) + `"`, ""},
		{"cluster name at 256 bytes", []string{"--cluster", long(256)}, "", "256 bytes, at most 255 (gossip's label)"},

		// A unix socket's path holds 107 bytes, and PATH.fd takes 3 more:
		// past it the agent failed at start (bind: invalid argument).
		{"engine socket at 104 bytes", []string{"--engine-socket", "/" + long(103)}, `"engine_socket": "/` + long(103) + `"`, ""},
		{"engine socket at 105 bytes", []string{"--engine-socket", "/" + long(104)}, "", `"/` + long(104) + `" is 105 bytes, at most 104: a unix socket's path holds 107, and the .fd socket beside it adds 3`},

		{"socket mode 0660", []string{"--engine-socket-mode", "0660"}, `"engine_socket_mode": "0660"`, ""},
		{"socket mode 0664", []string{"--engine-socket-mode", "0664"}, "", "want 0600, 0620, 0640 or 0660"},
		{"socket mode 0400", []string{"--engine-socket-mode", "0400"}, "", "want 0600, 0620, 0640 or 0660"},
		{"socket mode not octal", []string{"--engine-socket-mode", "rw"}, "", "not an octal mode"},

		{"pool at 1MiB", []string{"--pool", "host=1MiB"}, `"host=1MiB"`, ""},
		{"pool a byte under 1MiB", []string{"--pool", "host=1048575"}, "", "below the smallest pool"},
		// The size as given, and what units there are: the message quoted
		// "1G" of 1GB.
		{"pool in a unit that is none", []string{"--pool", "host=1GB"}, "", `"host=1GB": size "1GB" is not a positive number of bytes with an optional unit KiB, MiB, GiB, TiB or B (e.g. 512MiB, 4GiB): "GB" is not one of them`},
		{"device fraction 1", []string{"--pool", "device=1.0"}, `"device=1.0"`, ""},
		{"device fraction past 1", []string{"--pool", "device=1.01"}, "", "is not in (0, 1]"},
		{"device index 255", []string{"--pool", "device:255=1GiB"}, `"device:255=1GiB"`, ""},
		{"device index 256", []string{"--pool", "device:256=1GiB"}, "", "is not a CUDA index 0..255"},

		{"block set slots 0", []string{"--block-set-slots", "0"}, `!"block_set_slots"`, ""}, // 0: the default, not printed
		{"block set slots -1", []string{"--block-set-slots", "-1"}, "", "-1 is not in 1..67108864"},
		{"block set slots at layout.MaxSlots", []string{"--block-set-slots", "67108864"}, `"block_set_slots": 67108864`, ""},
		{"block set slots past layout.MaxSlots", []string{"--block-set-slots", "67108865"}, "", "67108865 is not in 1..67108864 (0: a quarter of the pool)"},

		{"grace at 24h", []string{"--block-set-grace", "24h"}, `"block_set_grace": "24h"`, ""},
		{"grace a nanosecond past 24h", []string{"--block-set-grace", "86400000000001ns"}, "", "24h0m0.000000001s is more than 24h"},
		{"grace 0s, the default", []string{"--block-set-grace", "0s"}, `"block_set_grace": "30s"`, ""},
		{"keepalive at 100ms", []string{"--session-keepalive", "100ms"}, `"session_keepalive": "100ms"`, ""},
		{"keepalive a nanosecond under 100ms", []string{"--session-keepalive", "99999999ns"}, "", "is not in 100ms..10m"},
		{"keepalive at 10m", []string{"--session-keepalive", "10m"}, `"session_keepalive": "10m"`, ""},
		{"keepalive a nanosecond past 10m", []string{"--session-keepalive", "600000000001ns"}, "", "is not in 100ms..10m"},
		{"lease at 1s", []string{"--lease-duration", "1s"}, `"lease_duration": "1s"`, ""},
		{"lease a nanosecond under 1s", []string{"--lease-duration", "999999999ns"}, "", "is not in 1s..5m"},
		{"lease at 5m", []string{"--lease-duration", "5m"}, `"lease_duration": "5m"`, ""},
		{"lease a nanosecond past 5m", []string{"--lease-duration", "300000000001ns"}, "", "is not in 1s..5m"},
		{"lease age at 1s", []string{"--max-lease-age", "1s"}, `"max_lease_age": "1s"`, ""},
		{"lease age a nanosecond under 1s", []string{"--max-lease-age", "999999999ns"}, "", "is not in 1s..24h"},
		{"lease age at 24h", []string{"--max-lease-age", "24h"}, `"max_lease_age": "24h"`, ""},
		{"lease age a nanosecond past 24h", []string{"--max-lease-age", "86400000000001ns"}, "", "is not in 1s..24h"},
		{"import timeout at 100ms", []string{"--import-timeout", "100ms"}, `"import_timeout": "100ms"`, ""},
		{"import timeout a nanosecond under 100ms", []string{"--import-timeout", "99999999ns"}, "", "is not in 100ms..1h"},
		{"import timeout 1ns", []string{"--import-timeout", "1ns"}, "", "1ns is not in 100ms..1h"},
		{"import timeout at 1h", []string{"--import-timeout", "1h"}, `"import_timeout": "1h"`, ""},
		{"import timeout a nanosecond past 1h", []string{"--import-timeout", "3600000000001ns"}, "", "is not in 100ms..1h"},
		{"negative import timeout", []string{"--import-timeout", "-1ns"}, "", "is negative"},
		{"peer timeout at 200ms", []string{"--peer-timeout", "200ms"}, `"peer_timeout": "200ms"`, ""},
		{"peer timeout a nanosecond under 200ms", []string{"--peer-timeout", "199999999ns"}, "", "is not in 200ms..5m"},
		{"peer timeout at 5m", []string{"--peer-timeout", "5m"}, `"peer_timeout": "5m"`, ""},
		{"peer timeout a nanosecond past 5m", []string{"--peer-timeout", "300000000001ns"}, "", "is not in 200ms..5m"},
		{"negative peer timeout", []string{"--peer-timeout", "-1s"}, "", "is negative"},
		{"hello timeout at 100ms", []string{"--lane-hello-timeout", "100ms"}, `"lane_hello_timeout": "100ms"`, ""},
		{"hello timeout a nanosecond under 100ms", []string{"--lane-hello-timeout", "99999999ns"}, "", "is not in 100ms..1m"},
		{"hello timeout at 1m", []string{"--lane-hello-timeout", "1m"}, `"lane_hello_timeout": "1m"`, ""},
		{"hello timeout a nanosecond past 1m", []string{"--lane-hello-timeout", "60000000001ns"}, "", "is not in 100ms..1m"},
		{"cache TTL at 1ms", []string{"--index-cache-ttl", "1ms"}, `"index_cache_ttl": "1ms"`, ""},
		{"cache TTL a nanosecond under 1ms", []string{"--index-cache-ttl", "999999ns"}, "", "is not in 1ms..1m"},
		{"cache TTL at 1m", []string{"--index-cache-ttl", "1m"}, `"index_cache_ttl": "1m"`, ""},
		{"cache TTL a nanosecond past 1m", []string{"--index-cache-ttl", "60000000001ns"}, "", "is not in 1ms..1m"},

		{"lease cap per peer 1", []string{"--max-leased-per-peer", "1"}, `"max_leased_per_peer": 1`, ""},
		{"lease cap per peer -1", []string{"--max-leased-per-peer", "-1"}, "", "-1 is negative"},
		{"lease cap 1", []string{"--max-leased", "1"}, `"max_leased": 1`, ""},
		{"lease cap -1", []string{"--max-leased", "-1"}, "", "-1 is negative"},

		{"import chunk at 1MiB", []string{"--import-chunk-bytes", "1MiB"}, `"import_chunk_bytes": 1048576`, ""},
		{"import chunk a byte under 1MiB", []string{"--import-chunk-bytes", "1048575"}, "", "1048575 is not in 1048576..4294967296"},
		{"import chunk at 4GiB", []string{"--import-chunk-bytes", "4GiB"}, `"import_chunk_bytes": 4294967296`, ""},
		{"import chunk a byte past 4GiB", []string{"--import-chunk-bytes", "4294967297"}, "", "4294967297 is not in 1048576..4294967296"},

		{"rdma port 255", []string{"--rdma-port", "255"}, `"rdma_port": 255`, ""},
		{"rdma port 256", []string{"--rdma-port", "256"}, "", "256 not in 1..255"},
		{"rdma port -1", []string{"--rdma-port", "-1"}, "", "-1 not in 1..255"},
		{"rdma timeout 1", []string{"--rdma-timeout", "1"}, `"rdma_timeout": 1`, ""},
		{"rdma timeout 31", []string{"--rdma-timeout", "31"}, `"rdma_timeout": 31`, ""},
		{"rdma timeout 32", []string{"--rdma-timeout", "32"}, "", "32 not in 1..31"},
		{"rdma timeout -1", []string{"--rdma-timeout", "-1"}, "", "-1 not in 1..31"},
		{"rdma retry 1", []string{"--rdma-retry", "1"}, `"rdma_retry": 1`, ""},
		{"rdma retry 7", []string{"--rdma-retry", "7"}, `"rdma_retry": 7`, ""},
		{"rdma retry 8", []string{"--rdma-retry", "8"}, "", "8 not in 1..7"},
		{"rdma retry -1", []string{"--rdma-retry", "-1"}, "", "-1 not in 1..7"},
		{"rdma neither", []string{"--rdma", "maybe"}, "", `"maybe" is not auto, on or off`},

		{"lane connections 1", []string{"--lane-conns", "1"}, `"lane_conns": 1`, ""},
		{"lane connections 16", []string{"--lane-conns", "16"}, `"lane_conns": 16`, ""},
		{"lane connections 17", []string{"--lane-conns", "17"}, "", "17 not in 1..16"},
		{"lane connections -1", []string{"--lane-conns", "-1"}, "", "-1 not in 1..16"},
		{"lane pending 1", []string{"--lane-max-pending", "1"}, `"lane_max_pending": 1`, ""},
		{"lane pending 65536", []string{"--lane-max-pending", "65536"}, `"lane_max_pending": 65536`, ""},
		{"lane pending 65537", []string{"--lane-max-pending", "65537"}, "", "65537 not in 1..65536"},
		{"lane pending -1", []string{"--lane-max-pending", "-1"}, "", "-1 not in 1..65536"},
		{"lane pending per source 1", []string{"--lane-max-pending-per-source", "1"}, `"lane_max_pending_per_source": 1`, ""},
		{"lane pending per source 65536", []string{"--lane-max-pending-per-source", "65536"}, `"lane_max_pending_per_source": 65536`, ""},
		{"lane pending per source 65537", []string{"--lane-max-pending-per-source", "65537"}, "", "65537 not in 1..65536"},
		{"lane pending per source -1", []string{"--lane-max-pending-per-source", "-1"}, "", "-1 not in 1..65536"},
		{"plain lane without an address", []string{"--lane-plain"}, "", "set without lane_addr"},

		{"fabric provider at 64 bytes", []string{"--fabric-provider", long(64)}, `"fabric_provider": "` + long(64) + `"`, ""},
		{"fabric provider at 65 bytes", []string{"--fabric-provider", long(65)}, "", "at most 64"},
		{"fabric address at 255 bytes", []string{"--fabric", "ofi", "--fabric-addr", long(255)}, `"fabric_addr": "` + long(255) + `"`, ""},
		{"fabric address at 256 bytes", []string{"--fabric", "ofi", "--fabric-addr", long(256)}, "", "256 bytes, at most 255"},

		// At least the cost of the largest request (twice its 64MiB): a
		// bound of 1 byte refused every request.
		{"request memory at 128MiB", []string{"--engine-request-memory", "128MiB"}, `"engine_request_memory": 134217728`, ""},
		{"request memory a byte under 128MiB", []string{"--engine-request-memory", "134217727"}, "", "134217727 is below 134217728 (128MiB), the cost of the largest engine request"},
		{"request memory 1", []string{"--engine-request-memory", "1"}, "", "1 is below 134217728 (128MiB), the cost of the largest engine request, which it would refuse every time; is a unit missing? (e.g. 512MiB)"},
		{"session request memory at 128MiB", []string{"--engine-session-request-memory", "128MiB"}, `"engine_session_request_memory": 134217728`, ""},
		{"session request memory a byte under 128MiB", []string{"--engine-session-request-memory", "134217727"}, "", "134217727 is below 134217728 (128MiB)"},
		{"session request memory 1", []string{"--engine-session-request-memory", "1"}, "", "is a unit missing? (e.g. 256MiB)"},
		{"session request memory at the whole", []string{"--engine-request-memory", "200MiB", "--engine-session-request-memory", "200MiB"}, `"engine_session_request_memory": 209715200`, ""},
		{"session request memory a byte past the whole", []string{"--engine-request-memory", "200MiB", "--engine-session-request-memory", "209715201"}, "", "209715201 is not in 134217728..engine_request_memory (209715200)"},
		{"engine quota at 1MiB", []string{"--engine-quota", "1MiB"}, `"engine_quota": 1048576`, ""},
		{"engine quota a byte under 1MiB", []string{"--engine-quota", "1048575"}, "", "1048575 is below the smallest pool, 1048576 bytes (1MiB); is a unit missing?"},
		{"engine quota 1", []string{"--engine-quota", "1"}, "", "1 is below the smallest pool"},
		{"engine sessions 1", []string{"--engine-sessions", "1"}, `"engine_sessions_per_process": 1`, ""}, // the default per process cut to it
		{"engine sessions 65536", []string{"--engine-sessions", "65536"}, `"engine_sessions": 65536`, ""},
		{"engine sessions 65537", []string{"--engine-sessions", "65537"}, "", "65537 is not in 1..65536"},
		{"engine sessions -1", []string{"--engine-sessions", "-1"}, "", "-1 is not in 1..65536"},
		{"sessions per process at the whole", []string{"--engine-sessions", "8", "--engine-sessions-per-process", "8"}, `"engine_sessions_per_process": 8`, ""},
		{"sessions per process one past the whole", []string{"--engine-sessions", "8", "--engine-sessions-per-process", "9"}, "", "9 is not in 1..engine_sessions (8)"},
		{"sessions per process -1", []string{"--engine-sessions-per-process", "-1"}, "", "-1 is not in 1..engine_sessions (1024)"},

		{"disk tier at 16MiB", []string{"--tier", "disk=" + dir + "/d:16MiB"}, `"disk=` + dir + `/d:16MiB"`, ""},
		{"disk tier a byte under 16MiB", []string{"--tier", "disk=" + dir + "/d:16777215"}, "", "size 16777215 is not in 16777216 (16MiB)"},
		{"disk tier at 1000GiB", []string{"--tier", "disk=" + dir + "/d:1000GiB"}, `"disk=` + dir + `/d:1000GiB"`, ""},
		{"disk tier a byte past 1000GiB", []string{"--tier", "disk=" + dir + "/d:1073741824001"}, "", "(1000GiB)"},
		{"host tier at 16MiB", []string{"--tier", "host=16MiB"}, `"host=16MiB"`, ""},
		{"host tier a byte under 16MiB", []string{"--tier", "host=16777215"}, "", "host tier size 16777215 is not in 16777216 (16MiB)"},
		{"host tier a byte past 1TiB", []string{"--tier", "host=1099511627777"}, "", "(1TiB)"},
		{"two host tiers", []string{"--tier", "host=16MiB", "--tier", "host=32MiB"}, "", "a second host tier"},
		{"8 tiers", tiers(8), `"disk=` + filepath.Join(dir, "t7") + `:1GiB"`, ""},
		{"9 tiers", tiers(9), "", "9 tiers, at most 8"},
		{"watermark 1", []string{"--tier-watermark", "1"}, `"tier_watermark": 1`, ""},
		{"watermark past 1", []string{"--tier-watermark", "1.000001"}, "", "1.000001 is not in (0, 1]"},
		{"negative watermark", []string{"--tier-watermark", "-0.1"}, "", "-0.1 is not in (0, 1]"},
		{"in flight 1", []string{"--tier-in-flight", "1"}, `"tier_in_flight": 1`, ""},
		{"in flight past 1", []string{"--tier-in-flight", "1.000001"}, "", "1.000001 is not in (0, 1]"},
		{"queue 1", []string{"--tier-queue", "1"}, `"tier_queue": 1`, ""},
		{"queue 4096", []string{"--tier-queue", "4096"}, `"tier_queue": 4096`, ""},
		{"queue 4097", []string{"--tier-queue", "4097"}, "", "4097 is not in 1..4096"},
		{"queue -1", []string{"--tier-queue", "-1"}, "", "-1 is not in 1..4096"},
		{"staging 1", []string{"--tier-staging-slots", "1"}, `"tier_staging_slots": 1`, ""},
		{"staging 4096", []string{"--tier-staging-slots", "4096"}, `"tier_staging_slots": 4096`, ""},
		{"staging 4097", []string{"--tier-staging-slots", "4097"}, "", "4097 is not in 1..4096"},
		{"staging -1", []string{"--tier-staging-slots", "-1"}, "", "-1 is not in 1..4096"},
		{"block bytes 1GiB", []string{"--tier-block-bytes", "1GiB"}, `"tier_block_bytes": 1073741824`, ""},
		{"block bytes a byte past 1GiB", []string{"--tier-block-bytes", "1073741825"}, "", "1073741825 is not in 1..1073741824"},
		{"read-ahead 0", []string{"--tier-read-ahead", "0"}, `"tier_read_ahead": 0`, ""}, // 0: off, printed (the default is 16)
		{"read-ahead 256", []string{"--tier-read-ahead", "256"}, `"tier_read_ahead": 256`, ""},
		{"read-ahead 257", []string{"--tier-read-ahead", "257"}, "", "257 is not in 0..256"},
		{"read-ahead -1", []string{"--tier-read-ahead", "-1"}, "", "-1 is not in 0..256"},

		{"replicas 1", []string{"--index-mode", "owned", "--index-replicas", "1"}, `"index_replicas": 1`, ""},
		{"replicas 8", []string{"--index-mode", "owned", "--index-replicas", "8"}, `"index_replicas": 8`, ""},
		{"replicas 9", []string{"--index-mode", "owned", "--index-replicas", "9"}, "", "9 not in 1..8"},
		{"replicas -1", []string{"--index-replicas", "-1"}, "", "-1 not in 1..8"},
		{"index mode neither", []string{"--index-mode", "sharded"}, "", `"sharded" is not whole or owned`},
		{"hashes a holder 1", []string{"--index-max-node-blocks", "1"}, `"index_max_node_blocks": 1`, ""},
		{"hashes a holder -1", []string{"--index-max-node-blocks", "-1"}, "", "-1 is not positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"agent", "--local", "--data-dir", filepath.Join(dir, "data"), "--print-config"}, tc.args...)
			code, out, errs := runCmd(t, "", args...)
			if tc.refused == "" {
				if absent, ok := strings.CutPrefix(tc.shown, "!"); ok {
					if code != 0 || strings.Contains(out, absent) || !strings.Contains(out, `"node_name"`) {
						t.Fatalf("exit %d (%s); want 0 and settings without %s:\n%s", code, errs, absent, out)
					}
					return
				}
				if code != 0 || !strings.Contains(out, tc.shown) {
					t.Fatalf("exit %d (%s); want 0 and %s in:\n%s", code, errs, tc.shown, out)
				}
				return
			}
			// The error names the setting of the last flag given, by its
			// key and its flag.
			key, flag := "", ""
			for i := len(tc.args) - 1; i >= 0 && key == ""; i-- {
				for _, s := range agentSettings {
					if "--"+s.flag == tc.args[i] {
						key, flag = configKey(s.field), tc.args[i]
					}
				}
			}
			named := regexp.MustCompile(regexp.QuoteMeta(key) + `(\[[0-9]+\])? \(` + flag + `\): `)
			if code != 2 || !named.MatchString(errs) || !strings.Contains(errs, tc.refused) || strings.Count(errs, "\n") != 1 {
				t.Fatalf("exit %d, %q; want 2 and one line naming %s (%s) and saying %q", code, errs, key, flag, tc.refused)
			}
		})
	}
}

// A duration flag's help gives its default and bounds as fabric holds
// them. Zero given is the default, so a setting with no floor says "at
// most", not a range from zero that a zero given does not mean.
func TestAgentHelpDurationRanges(t *testing.T) {
	_, _, help := runCmd(t, "", "agent", "-h")
	for _, want := range []string{
		"(default 30s, at most 24h)", // --block-set-grace
		"(default 10m, 1s..24h)",     // --max-lease-age
		"(default 5s, 100ms..10m)",   // --session-keepalive
		"(default 3s, 100ms..1m)",    // --lane-hello-timeout
		"(default 30s, 100ms..1h)",   // --import-timeout
		"(default 2s, 200ms..5m)",    // --peer-timeout
	} {
		if !strings.Contains(help, want) {
			t.Errorf("agent -h lacks %q", want)
		}
	}
	if strings.Contains(help, " 0s..") {
		t.Errorf("agent -h gives a range from 0s:\n%s", help)
	}
}

// The same limits hold for a setting from the environment or the
// configuration file, refused naming the setting's key.
func TestAgentSettingLimitsFromEnvironmentAndFile(t *testing.T) {
	dir := t.TempDir()
	file := func(json string) string {
		p := filepath.Join(t.TempDir(), "agent.json")
		if err := os.WriteFile(p, []byte(json), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name           string
		environ        []string
		args           []string
		shown, refused string
	}{
		{"queue 4096 from the environment", []string{"KVFABRIC_TIER_QUEUE=4096"}, nil, `"tier_queue": 4096`, ""},
		{"queue 4097 from the environment", []string{"KVFABRIC_TIER_QUEUE=4097"}, nil, "", "tier_queue (--tier-queue): 4097 is not in 1..4096"},
		{"watermark NaN from the environment", []string{"KVFABRIC_TIER_WATERMARK=NaN"}, nil, "", "tier_watermark (--tier-watermark): NaN is not in (0, 1]"},
		{"lease age 24h from the environment", []string{"KVFABRIC_MAX_LEASE_AGE=24h"}, nil, `"max_lease_age": "24h"`, ""},
		{"lease age past 24h from the environment", []string{"KVFABRIC_MAX_LEASE_AGE=24h0m1s"}, nil, "", "max_lease_age (--max-lease-age): 24h0m1s is not in 1s..24h"},
		{"replicas 8 from the file", nil, []string{"--config", file(`{"index_mode": "owned", "index_replicas": 8}`)}, `"index_replicas": 8`, ""},
		{"replicas 9 from the file", nil, []string{"--config", file(`{"index_mode": "owned", "index_replicas": 9}`)}, "", "index_replicas (--index-replicas): 9 not in 1..8"},
		{"lane pending past its limit from the file", nil, []string{"--config", file(`{"lane_max_pending": 65537}`)}, "", "lane_max_pending (--lane-max-pending): 65537 not in 1..65536"},
		{"node name with a colon from the file", nil, []string{"--config", file(`{"node_name": "a:b"}`)}, "", `node_name (--node): "a:b" must be`},
		{"grace past 24h from the file", nil, []string{"--config", file(`{"block_set_grace": "25h"}`)}, "", "block_set_grace (--block-set-grace): 25h is more than 24h"},
		{"peer timeout 5m from the file", nil, []string{"--config", file(`{"peer_timeout": "5m"}`)}, `"peer_timeout": "5m"`, ""},
		{"peer timeout past 5m from the file", nil, []string{"--config", file(`{"peer_timeout": "5m0.001s"}`)}, "", "peer_timeout (--peer-timeout): 5m0.001s is not in 200ms..5m"},
		{"import timeout under 100ms from the environment", []string{"KVFABRIC_IMPORT_TIMEOUT=1ns"}, nil, "", "import_timeout (--import-timeout): 1ns is not in 100ms..1h"},
		{"engine sessions past the bound from the environment", []string{"KVFABRIC_ENGINE_SESSIONS=65537"}, nil, "", "engine_sessions (--engine-sessions): 65537 is not in 1..65536"},
		// The engine socket named by the data directory, too long for a
		// unix socket: either setting shortens it.
		{"data dir at the engine socket's bound", nil, []string{"--data-dir", "/" + strings.Repeat("d", 91)}, `"engine_socket": "/` + strings.Repeat("d", 91) + `/engine.sock"`, ""},
		{"data dir past the engine socket's bound", nil, []string{"--data-dir", "/" + strings.Repeat("d", 92)}, "",
			`data_dir (--data-dir), engine_socket (--engine-socket): "/` + strings.Repeat("d", 92) + `/engine.sock" is 105 bytes, at most 104: a unix socket's path holds 107, and the .fd socket beside it adds 3: give a shorter data_dir, or an engine_socket of its own`},
		// Keys are matched exactly: encoding/json's match regardless of
		// case took this as 30ns, past the durations' check.
		{"a key in another case in the file", nil, []string{"--config", file(`{"Block_Set_Grace": 30}`)}, "", `unknown key "Block_Set_Grace": keys are lower case ("block_set_grace")`},
		{"a key named as the field in the file", nil, []string{"--config", file(`{"NodeName": "zz"}`)}, "", `unknown key "NodeName": no setting has it`},
		{"sessions per process past the whole from the file", nil, []string{"--config", file(`{"engine_sessions": 8, "engine_sessions_per_process": 9}`)}, "", "engine_sessions_per_process (--engine-sessions-per-process): 9 is not in 1..engine_sessions (8)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"agent", "--local", "--data-dir", filepath.Join(dir, "data"), "--print-config"}, tc.args...)
			code, out, errs := runEnv(t, tc.environ, args...)
			switch {
			case tc.refused == "" && (code != 0 || !strings.Contains(out, tc.shown)):
				t.Fatalf("exit %d (%s); want 0 and %s in:\n%s", code, errs, tc.shown, out)
			case tc.refused != "" && (code != 2 || !strings.Contains(errs, tc.refused)):
				t.Fatalf("exit %d, %q; want 2 and %q", code, errs, tc.refused)
			}
		})
	}
}

// A setting refused as the agent starts, past what validation can know,
// names its flag beside its key as one refused by validation does: a host
// pool larger than the machine's memory (1 PiB: more than any machine
// this runs on).
func TestAgentStartRefusalNamesTheFlag(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the machine's memory is read on Linux only")
	}
	dir := t.TempDir()
	code, _, errs := runCmd(t, "", "agent", "--local", "--data-dir", filepath.Join(dir, "data"), "--metrics-addr", "off", "--pool", "host=1048576GiB")
	want := "kvfabric agent: fabric: invalid configuration: pools (--pool): a host pool of 1125899906842624 bytes is more than this machine's memory ("
	if code != 2 || !strings.HasPrefix(errs, want) || strings.Count(errs, "\n") != 1 {
		t.Fatalf("exit %d, %q; want 2 and one line saying %q", code, errs, want)
	}
}

// What the agent refuses as it starts, reading files and devices, names
// the setting by its key and its flag as validation does: the gossip key
// file, rdma=on where RDMA cannot be used, and the TLS files, one of them
// or (where the fault is in how they go together, or none is given) all
// three, the file at fault named in what follows.
func TestAgentStartRefusalsNameKeyAndFlag(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	missing := filepath.Join(dir, "missing")
	tls := "ca_file (--ca), cert_file (--cert), key_file (--key): "
	for _, tc := range []struct {
		name string
		args []string
		want string // after "kvfabric agent: fabric: invalid configuration: "
	}{
		{"gossip key file missing", []string{"--gossip-key-file", missing},
			"gossip_key_file (--gossip-key-file): open " + missing + ": no such file"},
		{"gossip key file with a bad key", []string{"--gossip-key-file", write("bad.key", "bm90IGEga2V5\n")},
			"gossip_key_file (--gossip-key-file): " + filepath.Join(dir, "bad.key") + " line 1: not a base64 key"},
		{"gossip key file without a key", []string{"--gossip-key-file", write("empty.key", "# none\n")},
			"gossip_key_file (--gossip-key-file): " + filepath.Join(dir, "empty.key") + " holds no key"},
		{"rdma on without RDMA", []string{"--rdma", "on", "--fabric", "verbs", "--rdma-library", missing},
			"rdma (--rdma): on, and RDMA cannot be used: "},
		{"a CA without the certificate", []string{"--ca", missing},
			"cert_file (--cert): missing: the CA, certificate and key files go together"},
		{"TLS files that do not load", []string{"--ca", missing, "--cert", missing, "--key", missing},
			tls + "TLS identity of node n1: "},
		{"no TLS files and no --dev", []string{"--dev=false"},
			tls + "all three are required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"agent", "--local", "--node", "n1", "--data-dir", filepath.Join(dir, "data"), "--dev-ca-dir", filepath.Join(dir, "ca"),
				"--gossip-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0", "--metrics-addr", "off", "--pool", "host=16MiB"}, tc.args...)
			code, _, errs := runCmd(t, "", args...)
			want := "kvfabric agent: fabric: invalid configuration: " + tc.want
			if code != 2 || !strings.HasPrefix(errs, want) || strings.Count(errs, "\n") != 1 {
				t.Fatalf("exit %d, %q; want 2 and one line starting %q", code, errs, want)
			}
		})
	}
}
