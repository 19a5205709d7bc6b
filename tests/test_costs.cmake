# Included by ctest after the gtest-discovered test lists (tests/CMakeLists.txt,
# TEST_INCLUDE_FILES): the longest tests, with rough seconds as COST, so that
# `ctest -jN` starts them first even in a fresh build directory (no
# Testing/Temporary/CTestCostData.txt yet) and the run does not end on one of
# them alone. Only the order matters: the seconds are the larger of what the
# gcc Debug and the ASan+UBSan runs of scripts/test.sh took. A name that no
# longer exists is ignored; a new long test belongs here. ctest includes
# this file before the tests that tests/CMakeLists.txt declares with
# add_test, so those get their COST where they are declared.
set_tests_properties(PoolModelTest.RandomSequencesMatchTheModel PROPERTIES COST 64)
set_tests_properties(KillLoopTest.SigkillAtRandomMomentsKeepsAcknowledgedData PROPERTIES COST 66)
set_tests_properties(PowerLossTest.CommittedStateSurvivesEveryCut PROPERTIES COST 40)
set_tests_properties(RocksDbStoreTest.BytesPerMappedBlockSequential PROPERTIES COST 36)
set_tests_properties(RocksDbStoreTest.BytesPerMappedBlockScattered PROPERTIES COST 31)
set_tests_properties(ResolvedWalkTest.AgreesWithTheEngineOnRandomHistories PROPERTIES COST 27)
set_tests_properties(ControlTest.FioVerifiesWhileSnapshotsComeAndGo PROPERTIES COST 18)
set_tests_properties(MappingWalkTest.RandomOperationsMatchEngineReads PROPERTIES COST 17)

# Tests that set the kernel's FUSE-over-io_uring knob run one at a time
# (tests/CMakeLists.txt, e2e_*_over_io_uring).
set_tests_properties(UringServerTest.EveryKindOfRequestRoundTripsThroughTheRings
  UringServerTest.ConcurrentClientsOnEveryCpuGetTheirOwnReplies
  UringServerTest.OffServesEverythingThroughDevFuse
  UringServerTest.TheMountIsReadyOnceEveryRingEntryIsRegistered
  UringServerTest.EntriesThatNeverRegisterDoNotHoldTheMountBack
  UringServerTest.EntriesTheKernelRefusesDoNotHoldTheMountBack
  UringServerTest.AKnobOffWhileTheKernelReadsTheReplyIsHeeded
  UringServerTest.AKnobTurnedOffAfterTheOfferIsHeeded
  UringServerTest.ARefusedReplyIsCommittedAgainOnceTheKnobIsBack
  FuseTest.IoUringOptionChoosesTheTransport
  PROPERTIES RESOURCE_LOCK fuse_io_uring_knob)

# Its child's reads under a memory cgroup leave the kernel's records of
# evicted pages (which it needs) in most tries when it runs alone, but in
# few while other test processes run beside it: the page cache it reads
# then ends at 768 cached pages and no record of any eviction (seen under
# `ctest -j2`; the cause is not known). So it runs alone.
set_tests_properties(FileBlockDeviceTest.ReadAroundLeavesWindowsThatReclaimEvicted
  PROPERTIES RUN_SERIAL TRUE)
