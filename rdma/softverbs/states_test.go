package softverbs_test

import (
	"fmt"
	"testing"
)

// Attribute-mask bits (enum ibv_qp_attr_mask).
const (
	mState         = 1 << 0
	mCurState      = 1 << 1
	mAccessFlags   = 1 << 3
	mPkeyIndex     = 1 << 4
	mPort          = 1 << 5
	mQkey          = 1 << 6
	mAV            = 1 << 7
	mPathMTU       = 1 << 8
	mTimeout       = 1 << 9
	mRetryCnt      = 1 << 10
	mRnrRetry      = 1 << 11
	mRqPSN         = 1 << 12
	mMaxQPRdAtomic = 1 << 13
	mAltPath       = 1 << 14
	mMinRnrTimer   = 1 << 15
	mSqPSN         = 1 << 16
	mMaxDestRdAtom = 1 << 17
	mDestQPN       = 1 << 20
	maskInit       = mState | mPkeyIndex | mPort | mAccessFlags
	maskRTR        = mState | mAV | mPathMTU | mDestQPN | mRqPSN | mMaxDestRdAtom | mMinRnrTimer
	maskRTS        = mState | mTimeout | mRetryCnt | mRnrRetry | mSqPSN | mMaxQPRdAtomic
)

// Each transition of the RC state machine checks its attribute mask as the
// kernel's table does for mlx5 and rxe: a missing required bit, an extra bit
// or a transition not in the table is EINVAL and leaves the state as it was;
// so are out-of-range values.
func TestStateMachineMasks(t *testing.T) {
	w := newWorld(t)
	p := w.open("qp", "")
	type step struct {
		desc  string
		args  string
		rc    int
		state int
	}
	var steps []step
	add := func(desc string, rc, state int, format string, args ...any) {
		steps = append(steps, step{desc, fmt.Sprintf(format, args...), rc, state})
	}
	// RESET
	add("RESET->RTR skips INIT", eInval, qpsReset, "state=%d mask=%d", qpsRTR, maskRTR)
	add("RESET->RTS", eInval, qpsReset, "state=%d mask=%d", qpsRTS, maskRTS)
	for _, bit := range []int{mPkeyIndex, mPort, mAccessFlags} {
		add(fmt.Sprintf("RESET->INIT without bit %#x", bit), eInval, qpsReset, "state=%d mask=%d", qpsInit, maskInit&^bit)
	}
	add("RESET->INIT with QKEY (UD only)", eInval, qpsReset, "state=%d mask=%d", qpsInit, maskInit|mQkey)
	add("RESET->INIT with AV", eInval, qpsReset, "state=%d mask=%d", qpsInit, maskInit|mAV)
	add("RESET->INIT port 2", eInval, qpsReset, "state=%d mask=%d port=2", qpsInit, maskInit)
	add("RESET->INIT pkey index 1", eInval, qpsReset, "state=%d mask=%d pkey=1", qpsInit, maskInit)
	add("RESET->INIT remote-write|local-write access bits outside QP access", eInval, qpsReset, "state=%d mask=%d access=1", qpsInit, maskInit)
	add("RESET->INIT", 0, qpsInit, "state=%d mask=%d", qpsInit, maskInit)
	// INIT
	add("INIT->INIT, optional bits", 0, qpsInit, "state=%d mask=%d", qpsInit, mState|mAccessFlags)
	add("INIT->RTS", eInval, qpsInit, "state=%d mask=%d", qpsRTS, maskRTS)
	for _, bit := range []int{mAV, mPathMTU, mDestQPN, mRqPSN, mMaxDestRdAtom, mMinRnrTimer} {
		add(fmt.Sprintf("INIT->RTR without bit %#x", bit), eInval, qpsInit, "state=%d mask=%d", qpsRTR, maskRTR&^bit)
	}
	add("INIT->RTR with an RTS bit (timeout)", eInval, qpsInit, "state=%d mask=%d", qpsRTR, maskRTR|mTimeout)
	add("INIT->RTR with alternate path", eInval, qpsInit, "state=%d mask=%d", qpsRTR, maskRTR|mAltPath)
	add("INIT->RTR max_dest_rd_atomic 17 (past the device's 16)", eInval, qpsInit, "state=%d mask=%d mdra=17", qpsRTR, maskRTR)
	add("INIT->RTR path_mtu 6", eInval, qpsInit, "state=%d mask=%d mtu=6", qpsRTR, maskRTR)
	add("INIT->RTR dest QPN past 24 bits", eInval, qpsInit, "state=%d mask=%d dqpn=%d", qpsRTR, maskRTR, 1<<24)
	add("INIT->RTR RoCE without GRH", eInval, qpsInit, "state=%d mask=%d global=0 dlid=5", qpsRTR, maskRTR)
	add("INIT->RTR zero dgid", eInval, qpsInit, "state=%d mask=%d zerogid=1", qpsRTR, maskRTR)
	add("INIT->RTR sgid index past the table", eInval, qpsInit, "state=%d mask=%d sgid=4", qpsRTR, maskRTR)
	add("INIT->RTR max_dest_rd_atomic 16 (at the device's limit)", 0, qpsRTR, "state=%d mask=%d mdra=16", qpsRTR, maskRTR)
	// RTR
	add("RTR->RTR", eInval, qpsRTR, "state=%d mask=%d", qpsRTR, mState)
	for _, bit := range []int{mTimeout, mRetryCnt, mRnrRetry, mSqPSN, mMaxQPRdAtomic} {
		add(fmt.Sprintf("RTR->RTS without bit %#x", bit), eInval, qpsRTR, "state=%d mask=%d", qpsRTS, maskRTS&^bit)
	}
	add("RTR->RTS with an RTR bit (dest QPN)", eInval, qpsRTR, "state=%d mask=%d", qpsRTS, maskRTS|mDestQPN)
	add("RTR->RTS retry_cnt 8", eInval, qpsRTR, "state=%d mask=%d retry=8", qpsRTS, maskRTS)
	add("RTR->RTS timeout 32", eInval, qpsRTR, "state=%d mask=%d timeout=32", qpsRTS, maskRTS)
	add("RTR->RTS max_rd_atomic 17", eInval, qpsRTR, "state=%d mask=%d mra=17", qpsRTS, maskRTS)
	add("RTR->RTS with a wrong CUR_STATE", eInval, qpsRTR, "state=%d mask=%d cur=%d", qpsRTS, maskRTS|mCurState, qpsInit)
	add("RTR->RTS at the limits (timeout 31, retry 7, max_rd_atomic 16), CUR_STATE right", 0, qpsRTS,
		"state=%d mask=%d cur=%d timeout=31 retry=7 mra=16", qpsRTS, maskRTS|mCurState, qpsRTR)
	// RTS
	add("RTS->RTS, optional min_rnr_timer", 0, qpsRTS, "state=%d mask=%d", qpsRTS, mState|mMinRnrTimer)
	add("RTS->RTS with a required-once bit (SQ PSN)", eInval, qpsRTS, "state=%d mask=%d", qpsRTS, mState|mSqPSN)
	add("RTS->INIT", eInval, qpsRTS, "state=%d mask=%d", qpsInit, maskInit)
	add("RTS->ERR with an extra bit", eInval, qpsRTS, "state=%d mask=%d", qpsErr, mState|mTimeout)
	add("RTS->ERR", 0, qpsErr, "state=%d mask=%d", qpsErr, mState)
	add("ERR->RTS", eInval, qpsErr, "state=%d mask=%d", qpsRTS, maskRTS)
	add("ERR->RESET", 0, qpsReset, "state=%d mask=%d", qpsReset, mState)
	add("state 7 (past ERR)", eInval, qpsReset, "state=7 mask=%d", mState)
	add("RESET->INIT again", 0, qpsInit, "state=%d mask=%d", qpsInit, maskInit)
	add("INIT->RESET", 0, qpsReset, "state=%d mask=%d", qpsReset, mState)
	for i, s := range steps {
		f := p.ok("modify %s", s.args)
		if f["rc"] != itoa(s.rc) || f["state"] != itoa(s.state) {
			t.Errorf("step %d %s: rc %s state %s, want rc %d state %d", i, s.desc, f["rc"], f["state"], s.rc, s.state)
		}
	}
	// A post before RTS is refused.
	if ans := p.do("post wrid=1 sig=1 rkey=1 raddr=1 sge="); ans != "err rc=22 bad=1" {
		t.Fatalf("post in RESET: %q, want err rc=22 bad=1", ans)
	}
}
