package localagg

import (
	"reflect"
	"testing"
)

func TestHostsWire(t *testing.T) {
	hosts := []string{"", "a", "rack-7.b", ""}
	b := AppendHosts([]byte("stamp..."), hosts)
	after := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	got, rest, err := ParseHosts(append(b[8:], after...), len(hosts), 255)
	if err != nil || !reflect.DeepEqual(got, hosts) || !reflect.DeepEqual(rest, after) {
		t.Fatalf("ParseHosts = %q, %x, %v; want %q and the bytes after them %x", got, rest, err, hosts, after)
	}
	if got, rest, err := ParseHosts(nil, 2, 255); err != nil || !reflect.DeepEqual(got, []string{"", ""}) || len(rest) != 0 {
		t.Errorf("no hosts: %q, %x, %v", got, rest, err)
	}
	enc := b[8:]
	for _, bad := range [][]byte{
		enc[:len(enc)-1],                // short
		{0xff},                          // bad count
		AppendHosts(nil, []string{"a"}), // another count
	} {
		if _, _, err := ParseHosts(bad, len(hosts), 255); err == nil {
			t.Errorf("ParseHosts(%x): no error", bad)
		}
	}
	if _, _, err := ParseHosts(enc, len(hosts), 3); err == nil {
		t.Error("a host over the limit: no error")
	}
}

func FuzzParseHosts(f *testing.F) {
	f.Add(AppendHosts(nil, []string{"a", ""}), 2)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1000 {
			return
		}
		hosts, rest, err := ParseHosts(b, n, 255)
		if err == nil && (len(hosts) != n || len(rest) > len(b)) {
			t.Fatalf("%d hosts for %d nodes, %d bytes left of %d", len(hosts), n, len(rest), len(b))
		}
	})
}
