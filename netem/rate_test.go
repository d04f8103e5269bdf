package netem

import "testing"

func TestFormatRate(t *testing.T) {
	for _, tc := range []struct {
		bits uint64
		want string
	}{
		{400e6, "400mbit"},
		{1e9, "1gbit"},
		{25e8, "2500mbit"},
		{2500, "2500bit"},
		{16666666, "16666666bit"},
		{10e3, "10kbit"},
		{999, "999bit"},
	} {
		got := FormatRate(tc.bits)
		if got != tc.want {
			t.Errorf("FormatRate(%d) = %q, want %q", tc.bits, got, tc.want)
		}
		// What it writes, ParseRate reads back (above ParseRate's floor).
		if tc.bits >= minRate {
			if back, err := ParseRate(got); err != nil || back != tc.bits {
				t.Errorf("ParseRate(%q) = %d, %v; want %d", got, back, err, tc.bits)
			}
		}
	}
}

// Moved from cmd/fpt's divideRate test: the LB scenarios' default slow rate.
func TestDivideRate(t *testing.T) {
	for _, tc := range []struct {
		rate string
		div  uint64
		want string
	}{
		{"400mbit", 4, "100mbit"},
		{"100mbit", 4, "25mbit"},
		{"1gbit", 4, "250mbit"},
		{"1gbit", 1, "1gbit"},
		{"50mbit", 3, "16666666bit"},
		{"10kbit", 4, "2500bit"},
		{"100mbps", 4, "200mbit"},
	} {
		if got, err := DivideRate(tc.rate, tc.div); err != nil || got != tc.want {
			t.Errorf("DivideRate(%q, %d) = %q, %v; want %q", tc.rate, tc.div, got, err, tc.want)
		}
	}
	for _, bad := range []struct {
		rate string
		div  uint64
	}{{"none", 4}, {"100mbit", 0}} {
		if _, err := DivideRate(bad.rate, bad.div); err == nil {
			t.Errorf("DivideRate(%q, %d): no error", bad.rate, bad.div)
		}
	}
}

// Moved from cmd/fpt's capacityBytes test.
func TestCapacity(t *testing.T) {
	for _, tc := range []struct {
		h       HostSpec
		want    float64
		wantErr bool
	}{
		{HostSpec{Up: "400mbit", Down: "400mbit"}, 50e6, false},
		{HostSpec{Up: "1gbit", Down: "100mbit"}, 12.5e6, false}, // the slower side
		{HostSpec{Up: "80mbit", Down: "1gbit"}, 10e6, false},
		{HostSpec{Up: "100mbps", Down: "100mbps"}, 100e6, false}, // bytes per second already
		{HostSpec{}, 0, true},
		{HostSpec{Up: "100mbit"}, 0, true},
		{HostSpec{Up: "fast", Down: "fast"}, 0, true},
	} {
		got, err := tc.h.Capacity()
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%v.Capacity() = %v, %v; want %v (error %v)", tc.h, got, err, tc.want, tc.wantErr)
		}
	}
}
