package localagg

import (
	"reflect"
	"testing"
)

func TestHostsWire(t *testing.T) {
	hosts := []string{"", "a", "rack-7.b", ""}
	b := AppendHosts([]byte("stamp..."), hosts)
	got, err := ParseHosts(b[8:], len(hosts), 255)
	if err != nil || !reflect.DeepEqual(got, hosts) {
		t.Fatalf("ParseHosts = %q, %v; want %q", got, err, hosts)
	}
	if got, err := ParseHosts(nil, 2, 255); err != nil || !reflect.DeepEqual(got, []string{"", ""}) {
		t.Errorf("no hosts: %q, %v", got, err)
	}
	enc := b[8:]
	for _, bad := range [][]byte{
		enc[:len(enc)-1],                    // short
		append(append([]byte{}, enc...), 0), // trailing
		{0xff},                              // bad count
		AppendHosts(nil, []string{"a"}),     // another count
	} {
		if _, err := ParseHosts(bad, len(hosts), 255); err == nil {
			t.Errorf("ParseHosts(%x): no error", bad)
		}
	}
	if _, err := ParseHosts(enc, len(hosts), 3); err == nil {
		t.Error("a host over the limit: no error")
	}
}

func FuzzParseHosts(f *testing.F) {
	f.Add(AppendHosts(nil, []string{"a", ""}), 2)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1000 {
			return
		}
		hosts, err := ParseHosts(b, n, 255)
		if err == nil && len(hosts) != n {
			t.Fatalf("%d hosts for %d nodes", len(hosts), n)
		}
	})
}
