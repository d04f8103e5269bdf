package localagg

import (
	"reflect"
	"testing"
)

func TestJoinedWire(t *testing.T) {
	for _, j := range []Joined{
		{Sums: true, Hosts: []string{"", "a", "a", "b"}},
		{Sums: false, Hosts: []string{"", "", ""}},
	} {
		got, ok, err := ParseJoined(AppendJoined(nil, j), len(j.Hosts), 255)
		if err != nil || !ok || !reflect.DeepEqual(got, j) {
			t.Errorf("ParseJoined(AppendJoined(%+v)) = %+v, %v, %v", j, got, ok, err)
		}
	}
	if got, ok, err := ParseJoined(nil, 3, 255); err != nil || ok || got.Sums {
		t.Errorf("none sent: %+v, %v, %v; want not ok", got, ok, err)
	}
	enc := AppendJoined(nil, Joined{Sums: true, Hosts: []string{"a", "b"}})
	for _, tt := range []struct {
		name string
		b    []byte
		n    int
	}{
		{"hosts count only", enc[:2], 2},
		{"sums neither 0 nor 1", append([]byte{2}, enc[1:]...), 2},
		{"hosts cut", enc[:len(enc)-1], 2},
		{"hosts of another table", enc, 3},
		{"bytes after", append(append([]byte(nil), enc...), 0), 2},
	} {
		if _, _, err := ParseJoined(tt.b, tt.n, 255); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}

func FuzzParseJoined(f *testing.F) {
	f.Add(AppendJoined(nil, Joined{Sums: true, Hosts: []string{"a", ""}}), 2)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1000 {
			return
		}
		j, ok, err := ParseJoined(b, n, 255)
		if err != nil || !ok {
			return
		}
		if again, _, err := ParseJoined(AppendJoined(nil, j), n, 255); err != nil || !reflect.DeepEqual(again, j) {
			t.Fatalf("%+v does not round-trip: %+v, %v", j, again, err)
		}
	})
}
