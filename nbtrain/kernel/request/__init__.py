"""The request and its options, checked before any process starts: the options declared once
(:mod:`.options`), the checked configuration (:mod:`.config`, :mod:`.hosts`), the cell's analysis
(:mod:`.cell`), its inputs packed (:mod:`.inputs`), the notebook's own modules as ranks will see them
(:mod:`.notebook_modules`), and the base of every user mistake (:mod:`.mistakes`).
"""
